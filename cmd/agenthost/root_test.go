package main

import (
	"bytes"
	"strings"
	"testing"
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
