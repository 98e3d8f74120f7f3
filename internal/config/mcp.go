package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// mcpNamePattern is what an MCP server's name must match: it prefixes its
// tools' names (NAME__TOOL), which must stay valid tool names, and no
// underscore keeps the split at "__" plain.
var mcpNamePattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// maxMCPToolNameBytes bounds the server's own name of a tool an agent's
// tools entry names.
const maxMCPToolNameBytes = 128

// headerNamePattern is an HTTP header name (RFC 9110 token), lowercased.
var headerNamePattern = regexp.MustCompile("^[a-z0-9!#$%&'*+.^_`|~-]{1,128}$")

// envNamePattern is an environment variable's name.
var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// mcpReservedHeaders are the headers the transport sets itself.
var mcpReservedHeaders = []string{
	"host", "content-length", "content-type", "accept", "connection", "transfer-encoding", "upgrade",
	"mcp-session-id", "mcp-protocol-version", "last-event-id",
}

// mcpSecretHeaders are headers that carry credentials: never a literal
// value in the file.
var mcpSecretHeaders = []string{"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}

// mcpServers decodes mcp_servers: each server, streamable HTTP (url) or
// stdio (command), with its headers or environment and limits.
func (d *decoder) mcpServers(all map[string]any) map[string]MCPServer {
	out := map[string]MCPServer{}
	raw, ok := all["mcp_servers"]
	if !ok || raw == nil {
		return out
	}
	m, ok := raw.(map[string]any)
	if !ok {
		d.problem("mcp_servers", "want a map keyed by server name, such as {search: {url: \"https://mcp.example.com/mcp\"}}, got %s", typeName(raw))
		return out
	}
	for _, name := range sortedKeys(m) {
		k := "mcp_servers." + name
		if !mcpNamePattern.MatchString(name) {
			d.problem(k, "%q is not a valid MCP server name: use a-z first, then up to 31 of a-z, 0-9 and - (its tools are offered as NAME__TOOL, so no underscore; keys are lowercased)", name)
			continue
		}
		sm, isMap := m[name].(map[string]any)
		if !isMap {
			d.problem(k, "want a map (url and headers for streamable HTTP, or command, env and dir for stdio), got %s", typeName(m[name]))
			continue
		}
		out[name] = d.mcpServer(k+".", name, sm)
	}
	return out
}

// mcpServer decodes one server at key k (ending in ".").
func (d *decoder) mcpServer(k, name string, m map[string]any) MCPServer {
	s := MCPServer{Name: name}
	s.URL = strings.TrimSpace(d.strAt(m, k, "url", ""))
	s.Command = d.stringsAt(m, k, "command")
	switch {
	case s.URL != "" && len(s.Command) > 0:
		d.problem(k+"command", "is set, and so is url: a server is reached over streamable HTTP (url) or started by the host and spoken to over stdio (command); keep one")
	case s.URL == "" && len(s.Command) == 0:
		d.problem(strings.TrimSuffix(k, "."), "has neither url nor command: set url to a streamable HTTP endpoint (\"https://mcp.example.com/mcp\"), or command to the program the host starts ([\"npx\", \"-y\", \"some-mcp-server\"])")
	case s.URL != "":
		d.mcpURL(k+"url", s.URL)
	default:
		s.Command = d.mcpCommand(k, s.Command)
	}
	s.Headers = d.mcpStringMap(m, k, "headers", false)
	s.HeadersFromEnv = d.mcpStringMap(m, k, "headers_from_env", false)
	s.HeadersFromFile = d.mcpStringMap(m, k, "headers_from_file", false)
	d.mcpHeaders(k, &s)
	// The names of environment variables keep their case: read them as
	// the file writes them.
	s.Env = d.mcpStringMap(m, k, "env", true)
	s.EnvFromEnv = d.mcpStringMap(m, k, "env_from_env", true)
	d.mcpEnv(k, &s)
	if dir := d.strAt(m, k, "dir", ""); dir != "" {
		s.Dir = d.path(k+"dir", dir)
		if st, err := os.Stat(s.Dir); err != nil || !st.IsDir() {
			d.problem(k+"dir", "%s is not a directory: give the stdio server's working directory (a relative path is read from the config file's directory)", s.Dir)
		}
	}
	if !s.Stdio() && (s.Dir != "" || len(s.Env) > 0 || len(s.EnvFromEnv) > 0) {
		d.problem(k+"url", "is set with dir, env or env_from_env, which only a stdio server (command) takes: remove them, or use headers and headers_from_env for an HTTP server")
	}
	if s.Stdio() && (len(s.Headers) > 0 || len(s.HeadersFromEnv) > 0 || len(s.HeadersFromFile) > 0) {
		d.problem(k+"command", "is set with headers, which only an HTTP server (url) takes: pass what the server needs in env or env_from_env")
	}
	s.CallTimeout = d.durationAt(m, k, "call_timeout", DefaultMCPCallTimeout)
	if s.CallTimeout == 0 {
		d.problem(k+"call_timeout", "is 0: every request to the server needs a bound; want a duration such as 60s (the default)")
	}
	s.TaskTTL = d.durationAt(m, k, "task_ttl", DefaultMCPTaskTTL)
	if s.TaskTTL > 0 && s.TaskTTL < time.Minute {
		d.problem(k+"task_ttl", "%s is too short: a task must outlive a restart of this host for its call to be attached to; want 1m or more (default %s), or 0 to leave it to the server", s.TaskTTL, DefaultMCPTaskTTL)
	}
	s.MaxResultBytes = d.integerAt(m, k, "max_result_bytes", DefaultMCPMaxResultBytes, 16<<20)
	if s.MaxResultBytes < 1024 {
		d.problem(k+"max_result_bytes", "%d is too small for a tool's result: want 1024 to %d (default %d)", s.MaxResultBytes, 16<<20, DefaultMCPMaxResultBytes)
	}
	s.Backoff = d.durationAt(m, k, "backoff", DefaultMCPBackoff)
	s.MaxBackoff = d.durationAt(m, k, "max_backoff", DefaultMCPMaxBackoff)
	switch {
	case s.Backoff < 10*time.Millisecond:
		d.problem(k+"backoff", "%s is too short: the host would hammer a server that is down; want 10ms or more (default %s)", s.Backoff, DefaultMCPBackoff)
	case s.MaxBackoff < s.Backoff:
		d.problem(k+"max_backoff", "%s is less than backoff %s: raise max_backoff (default %s)", s.MaxBackoff, s.Backoff, DefaultMCPMaxBackoff)
	}
	return s
}

// mcpURL checks a streamable HTTP endpoint.
func (d *decoder) mcpURL(key, raw string) {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		d.problem(key, "%q is not a URL: %v", truncate(raw), err)
	case u.Scheme != "http" && u.Scheme != "https":
		d.problem(key, "%q is not an http or https URL: want the server's streamable HTTP endpoint, such as https://mcp.example.com/mcp (a stdio server takes command instead)", truncate(raw))
	case u.Hostname() == "":
		d.problem(key, "%q names no host", truncate(raw))
	case u.User != nil:
		d.problem(key, "carries credentials (user:password@): a secret never goes in the file; send them as a header with headers_from_env or headers_from_file")
	case u.Fragment != "":
		d.problem(key, "has a fragment (#…), which is never sent to a server: remove it")
	}
}

// mcpCommand checks a stdio server's command at k (ending in ".") and
// returns it with a relative program path resolved against the config
// file's directory.
func (d *decoder) mcpCommand(k string, cmd []string) []string {
	prog := strings.TrimSpace(cmd[0])
	if prog == "" {
		d.problem(k+"command", "begins with an empty program: the first entry is the program, the rest its arguments")
		return cmd
	}
	out := slices.Clone(cmd)
	if strings.ContainsRune(prog, filepath.Separator) {
		out[0] = d.path(k+"command", prog)
		if st, err := os.Stat(out[0]); err != nil || st.IsDir() {
			d.problem(k+"command", "program %s does not exist (a relative path is read from the config file's directory)", out[0])
		}
		return out
	}
	if _, err := exec.LookPath(prog); err != nil {
		d.problem(k+"command", "program %q is not found in the PATH of this process (%v): install it, or give its path", prog, errors.Unwrap(err))
	}
	return out
}

// mcpStringMap reads the map of strings at m[key]; asWritten takes its
// keys as the file writes them (viper lowercases every key), for
// environment variables.
func (d *decoder) mcpStringMap(m map[string]any, k, key string, asWritten bool) map[string]string {
	raw, ok := m[key]
	if !ok || raw == nil {
		return nil
	}
	vm, isMap := raw.(map[string]any)
	if !isMap {
		d.problem(k+key, "want a map of names to strings, got %s", typeName(raw))
		return nil
	}
	out := map[string]string{}
	if asWritten {
		server := strings.TrimSuffix(strings.TrimPrefix(k, "mcp_servers."), ".")
		if n := yamlAt(d.yaml, "mcp_servers", server, key); n != nil && n.Kind == yaml.MappingNode {
			keys, values, err := yamlPairs(n, k+key, map[*yaml.Node]bool{})
			if err != nil {
				d.problem(k+key, "%v", err)
				return nil
			}
			for i, name := range keys {
				v := yamlDeref(values[i])
				if v == nil || v.Kind != yaml.ScalarNode || v.ShortTag() == "!!null" {
					d.problem(k+key+"."+name, "want a string, number or boolean")
					continue
				}
				out[name] = v.Value
			}
			return out
		}
	}
	for name, v := range vm {
		switch v := v.(type) {
		case string:
			out[name] = v
		case bool, int, int64, uint64, float64:
			out[name] = fmt.Sprint(v)
		default:
			d.problem(k+key+"."+name, "want a string, number or boolean, got %s", typeName(v))
		}
	}
	return out
}

// mcpHeaders checks an HTTP server's headers: names, no header twice, no
// header the transport sets, no credential written in the file, and the
// variables and files the secret ones come from.
func (d *decoder) mcpHeaders(k string, s *MCPServer) {
	seen := map[string]string{}
	for _, src := range []struct {
		key string
		m   map[string]string
	}{{"headers", s.Headers}, {"headers_from_env", s.HeadersFromEnv}, {"headers_from_file", s.HeadersFromFile}} {
		for _, h := range sortedKeys(src.m) {
			hk := k + src.key + "." + h
			switch {
			case !headerNamePattern.MatchString(h):
				d.problem(hk, "%q is not an HTTP header name", truncate(h))
				continue
			case slices.Contains(mcpReservedHeaders, h):
				d.problem(hk, "is a header the MCP transport sets itself: remove it")
				continue
			case seen[h] != "":
				d.problem(hk, "is set under %s too: keep one", seen[h])
				continue
			}
			seen[h] = src.key
			v := src.m[h]
			switch src.key {
			case "headers":
				if slices.Contains(mcpSecretHeaders, h) {
					d.problem(hk, "carries a credential, which never goes in the file: move it to headers_from_env (%s: VARIABLE) or headers_from_file (%s: /path/to/secret)", h, h)
				}
			case "headers_from_env":
				if !envNamePattern.MatchString(v) {
					d.problem(hk, "%q is not the name of an environment variable", truncate(v))
				} else if _, set := os.LookupEnv(v); !set {
					d.problem(hk, "environment variable %s is not set: export it before starting agenthost (its value is the header's, read at each connection)", v)
				}
			case "headers_from_file":
				if v == "" {
					d.problem(hk, "is empty: give the file that holds the header's value")
					continue
				}
				path := d.path(hk, v)
				s.HeadersFromFile[h] = path
				if st, err := os.Stat(path); err != nil || st.IsDir() {
					d.problem(hk, "%s cannot be read: give the file that holds the header's value (read at each connection; a relative path is read from the config file's directory)", path)
				}
			}
		}
	}
}

// mcpEnv checks a stdio server's environment: names, none twice, and the
// host's variables passed on.
func (d *decoder) mcpEnv(k string, s *MCPServer) {
	for _, name := range sortedKeys(s.Env) {
		if !envNamePattern.MatchString(name) {
			d.problem(k+"env."+name, "%q is not the name of an environment variable", truncate(name))
		}
	}
	for _, name := range sortedKeys(s.EnvFromEnv) {
		ek := k + "env_from_env." + name
		from := s.EnvFromEnv[name]
		switch _, both := s.Env[name]; {
		case !envNamePattern.MatchString(name):
			d.problem(ek, "%q is not the name of an environment variable", truncate(name))
		case both:
			d.problem(ek, "is set under env too: keep one")
		case !envNamePattern.MatchString(from):
			d.problem(ek, "%q is not the name of an environment variable of this host", truncate(from))
		default:
			if _, set := os.LookupEnv(from); !set {
				d.problem(ek, "environment variable %s is not set: export it before starting agenthost, or remove the entry", from)
			}
		}
	}
}

// mcpReference checks that name names a declared MCP server, and reports
// whether it does.
func (d *decoder) mcpReference(key, name string, servers map[string]MCPServer) bool {
	if _, ok := servers[name]; ok {
		return true
	}
	declared := "none is declared"
	if len(servers) > 0 {
		declared = "declared: " + strings.Join(sortedKeys(servers), ", ")
	}
	d.problem(key, "names MCP server %q, which is not declared under mcp_servers (%s)", name, declared)
	return false
}

// mcpSchema is the part of the schema (schemaTree) under mcp_servers.NAME.
func mcpSchema() *node {
	n := tree(mcpKeys)
	for _, k := range mcpFreeMaps {
		n.children[k] = &node{free: true}
	}
	return n
}
