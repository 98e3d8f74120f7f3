package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func TestVersionPrintsABI(t *testing.T) {
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"version"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "plugin ABI v1") {
		t.Fatalf("version output %q does not name the ABI", out.String())
	}
}

func TestUnknownCommandFails(t *testing.T) {
	cmd := newRootCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"no-such-command"})
	if err := cmd.Execute(); err == nil {
		t.Fatal("an unknown command must fail")
	}
}

// The binary runs the plugin suite, so it must not link package testing
// (docs/DESIGN.md §2): the suite reports through its own Reporter.
func TestBinaryDoesNotLinkTesting(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "testing" {
			t.Fatal("cmd/agenthost links package testing")
		}
	}
}

func TestEveryCommandHasExamples(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && !c.Hidden && c.Example == "" { // hidden: internal (a bench's child process)
			t.Errorf("%q has no examples in its --help", c.CommandPath())
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}
