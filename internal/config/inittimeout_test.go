package config

import (
	"strings"
	"testing"
	"time"
)

// plugins.ID.init_timeout bounds a new instance's guest runtime start
// (host.Limits.InitTimeout), outside every call's timeout: the key the
// host's init_timeout message tells the operator to raise.
func TestPluginInitTimeoutKey(t *testing.T) {
	cfg, err := parse(t, minimal)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cfg.Plugins {
		if p.InitTimeout != 0 {
			t.Errorf("plugin %s: init_timeout %s by default, want 0 (the host's 30s)", p.ID, p.InitTimeout)
		}
	}
	cfg, err = parse(t, strings.Replace(minimal, "b: {path: b.wasm, role: builder}", "b: {path: b.wasm, role: builder, init_timeout: 45s}", 1))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range cfg.Plugins {
		if p.ID == "b" {
			found = true
			if p.InitTimeout != 45*time.Second {
				t.Errorf("plugin b: init_timeout %s, want 45s", p.InitTimeout)
			}
		}
	}
	if !found {
		t.Fatal("plugin b is missing")
	}
	_, err = parse(t, strings.Replace(minimal, "b: {path: b.wasm, role: builder}", "b: {path: b.wasm, role: builder, init_timeout: soon}", 1))
	if err == nil || !strings.Contains(err.Error(), "plugins.b.init_timeout") {
		t.Fatalf("init_timeout: soon gave %v, want a problem naming plugins.b.init_timeout", err)
	}
}
