//go:build !linux

package mcptool

import "os/exec"

// setProcAttr does nothing here: a stdio server ends when its stdin
// closes with the host.
func setProcAttr(*exec.Cmd) {}
