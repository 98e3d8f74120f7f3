package mcptool

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes a stdio server die with the host: a host killed with
// SIGKILL leaves no server behind (its stdin closing would end a
// well-behaved one anyway).
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
