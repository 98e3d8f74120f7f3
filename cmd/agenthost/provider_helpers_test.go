package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
)

// providerServe is a serve config for the model tests: tenant demo, its
// token, the example prompt-builder, and one example model executor
// (openai or anthropic) that reaches a fake provider on 127.0.0.1.
type providerServe struct {
	Token  string
	Model  string // the model executor: openai or anthropic
	Addr   string // the fake provider's host:port, the plugin's one allowed host
	URL    string // the plugin's base_url
	Config string // the rest of the plugin's config, as flow-map entries ("model: m, api_key: k")
	// PluginYAML is more keys of the model plugin (call_timeout: 5m),
	// one a line, indented by four spaces.
	PluginYAML string
	// Builder is the builder's config, a flow map; empty: none.
	Builder string
	// Tools are more example plugins to load, as executors.
	Tools []string
	// Tenant is more keys of tenant demo, indented by four spaces.
	Tenant string
	// LogFormat is json or text (the default).
	LogFormat string
}

// write builds the example plugins and writes the config into dir.
func (s providerServe) write(t *testing.T, dir string) string {
	t.Helper()
	path := func(name string) string { return conformance.ExampleWasm(t, name) }
	logFormat := s.LogFormat
	if logFormat == "" {
		logFormat = "text"
	}
	builder := ""
	if s.Builder != "" {
		builder = ", config: " + s.Builder
	}
	var b strings.Builder
	b.WriteString(`
data_dir: ` + filepath.Join(dir, "data") + `
sync_writes: true
cache_dir: ` + conformance.WazeroCacheDir() + `
log: {format: ` + logFormat + `, level: info}
plugins:
  prompt-builder: {path: ` + path("prompt-builder") + `, role: builder` + builder + `}
  ` + s.Model + `:
    path: ` + path(s.Model) + `
    role: executor
    allowed_hosts: ["` + s.Addr + `"]
    config: {base_url: "` + s.URL + `", ` + s.Config + `}
`)
	if s.PluginYAML != "" {
		b.WriteString(strings.TrimRight(s.PluginYAML, "\n") + "\n")
	}
	for _, tool := range s.Tools {
		b.WriteString("  " + tool + ": {path: " + path(tool) + ", role: executor}\n")
	}
	b.WriteString(`tenants:
  demo:
    tokens_sha256: [` + httpapi.HashToken(s.Token) + `]
    builder: prompt-builder
` + s.Tenant)
	return writeConfig(t, dir, b.String())
}
