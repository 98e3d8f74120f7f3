package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/loop"
)

// TestMCPServersAreDecoded: an HTTP server with its literal and secret
// headers, a stdio server with its command, environment (names as
// written) and directory, their limits and defaults; a tenant's
// top-level mcp_servers are tools of its default agent, and an agent's
// tools entry names a server and one of its tools, with its rules.
func TestMCPServersAreDecoded(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SEARCH_TOKEN", "s3cret")
	t.Setenv("FILES_KEY", "k")
	cfg, err := Parse(filepath.Join(dir, "agenthost.yaml"), []byte(agentPlugins+`
mcp_servers:
  search:
    url: https://mcp.example.com/mcp
    headers: {X-Team: tools}
    headers_from_env: {Authorization: SEARCH_TOKEN}
    headers_from_file: {X-Other-Token: token}
    call_timeout: 30s
  files:
    command: [sh, -c, "exec my-server"]
    env: {ROOT_DIR: /srv/files, Mixed_Case: "1"}
    env_from_env: {API_KEY: FILES_KEY}
    dir: .
    task_ttl: 0
    max_result_bytes: 4096
    backoff: 1s
    max_backoff: 1m
tenants:
  acme:
    builder: b
    model: openai
    tool_executors: [calc]
    mcp_servers: [search]
    tools:
      search__lookup: {approval: always}
    agents:
      support:
        model: {plugin: openai}
        tools:
          - {mcp: files, tool: read.file, approval: always, policy: {mode: retry}}
          - {mcp: search}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]MCPServer{
		"search": {Name: "search", URL: "https://mcp.example.com/mcp",
			Headers: map[string]string{"x-team": "tools"}, HeadersFromEnv: map[string]string{"authorization": "SEARCH_TOKEN"},
			HeadersFromFile: map[string]string{"x-other-token": filepath.Join(dir, "token")},
			CallTimeout:     30 * time.Second, TaskTTL: DefaultMCPTaskTTL, MaxResultBytes: DefaultMCPMaxResultBytes,
			Backoff: DefaultMCPBackoff, MaxBackoff: DefaultMCPMaxBackoff},
		"files": {Name: "files", Command: []string{"sh", "-c", "exec my-server"},
			Env: map[string]string{"ROOT_DIR": "/srv/files", "Mixed_Case": "1"}, EnvFromEnv: map[string]string{"API_KEY": "FILES_KEY"}, Dir: dir,
			CallTimeout: DefaultMCPCallTimeout, TaskTTL: 0, MaxResultBytes: 4096, Backoff: time.Second, MaxBackoff: time.Minute},
	}
	if !reflect.DeepEqual(cfg.MCPServers, want) {
		t.Fatalf("mcp_servers:\n got %+v\nwant %+v", cfg.MCPServers, want)
	}
	acme := cfg.Tenants["acme"]
	if got := acme.Agents[DefaultAgent].Tools; !reflect.DeepEqual(got, []AgentTool{{Plugin: "calc"}, {MCP: "search"}}) {
		t.Errorf("the default agent's tools: %+v", got)
	}
	support := acme.Agents["support"]
	if len(support.Tools) != 2 || support.Tools[0].MCP != "files" || support.Tools[0].Tool != "read.file" || support.Tools[0].Approval != "always" ||
		support.Tools[0].Policy == nil || support.Tools[0].Policy.Mode != loop.PolicyRetry || support.Tools[1] != (AgentTool{MCP: "search"}) {
		t.Errorf("support's tools: %+v", support.Tools)
	}
	if got := support.MCPServers(); !reflect.DeepEqual(got, []string{"files", "search"}) {
		t.Errorf("support's MCP servers: %v", got)
	}
}

// TestMCPProblemsNameTheirKeys: each problem of an MCP server or of a
// reference to one names its key, says what is wrong and what to do.
func TestMCPProblemsNameTheirKeys(t *testing.T) {
	t.Setenv("SET_VAR", "x")
	dir := t.TempDir()
	_, err := Parse(filepath.Join(dir, "agenthost.yaml"), []byte(agentPlugins+`
mcp_servers:
  both: {url: "https://a.example.com/mcp", command: [sh]}
  neither: {call_timeout: 5s}
  ftp: {url: "ftp://a.example.com/mcp"}
  creds: {url: "https://user:pw@a.example.com/mcp"}
  literal: {url: "https://a.example.com/mcp", headers: {Authorization: "Bearer abc"}}
  unset: {url: "https://a.example.com/mcp", headers_from_env: {X-Token: NOT_SET_ANYWHERE_42}}
  nofile: {url: "https://a.example.com/mcp", headers_from_file: {X-Token: missing.txt}}
  twice: {url: "https://a.example.com/mcp", headers: {X-A: "1"}, headers_from_env: {X-A: SET_VAR}}
  reserved: {url: "https://a.example.com/mcp", headers: {Mcp-Session-Id: "1"}}
  web_1: {url: "https://a.example.com/mcp"}
  envonhttp: {url: "https://a.example.com/mcp", env: {A: "1"}}
  headersonstdio: {command: [sh], headers: {X-A: "1"}}
  noprog: {command: [no-such-program-anywhere-42]}
  slow: {url: "https://a.example.com/mcp", backoff: 2m, max_backoff: 1m, task_ttl: 5s, urls: x}
tenants:
  acme:
    builder: b
    model: openai
    mcp_servers: [nope, ftp, ftp]
    agents:
      support:
        model: {plugin: openai}
        tools:
          - {mcp: gone}
          - {mcp: ftp, plugin: calc}
          - {mcp: ftp}
          - {mcp: ftp}
          - {mcp: both, tool: x}
          - {mcp: both}
`))
	if err == nil {
		t.Fatal("the config was accepted")
	}
	for _, want := range []string{
		`mcp_servers.both.command: is set, and so is url`,
		`mcp_servers.neither: has neither url nor command`,
		`mcp_servers.ftp.url: "ftp://a.example.com/mcp" is not an http or https URL`,
		`mcp_servers.creds.url: carries credentials (user:password@): a secret never goes in the file`,
		`mcp_servers.literal.headers.authorization: carries a credential, which never goes in the file: move it to headers_from_env`,
		`mcp_servers.unset.headers_from_env.x-token: environment variable NOT_SET_ANYWHERE_42 is not set`,
		`mcp_servers.nofile.headers_from_file.x-token: ` + filepath.Join(dir, "missing.txt") + ` cannot be read`,
		`mcp_servers.twice.headers_from_env.x-a: is set under headers too`,
		`mcp_servers.reserved.headers.mcp-session-id: is a header the MCP transport sets itself`,
		`mcp_servers.web_1: "web_1" is not a valid MCP server name`,
		`mcp_servers.envonhttp.url: is set with dir, env or env_from_env, which only a stdio server (command) takes`,
		`mcp_servers.headersonstdio.command: is set with headers, which only an HTTP server (url) takes`,
		`mcp_servers.noprog.command: program "no-such-program-anywhere-42" is not found in the PATH`,
		`mcp_servers.slow.max_backoff: 1m0s is less than backoff 2m0s`,
		`mcp_servers.slow.task_ttl: 5s is too short`,
		`mcp_servers.slow.urls: unknown key`,
		`tenants.acme.mcp_servers: names MCP server "nope", which is not declared under mcp_servers (declared: both, creds, `,
		`tenants.acme.mcp_servers: server "ftp" is listed twice`,
		`tenants.acme.agents.support.tools[0].mcp: names MCP server "gone", which is not declared`,
		`tenants.acme.agents.support.tools[1]: names plugin "calc" and MCP server "ftp"`,
		`tenants.acme.agents.support.tools[3]: lists MCP server "ftp" again`,
		`tenants.acme.agents.support.tools[5]: lists MCP server "both" again`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("no problem says %q; got:\n%v", want, err)
		}
	}
}

// TestTheExamplesMCPServersLoad: the commented mcp_servers block of
// config.example.yaml, uncommented, is a valid config (with sh standing
// in for npx, which a test machine may lack).
func TestTheExamplesMCPServersLoad(t *testing.T) {
	example, err := os.ReadFile("../../config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(example), "\n# mcp_servers:\n")
	block, _, _ = strings.Cut(block, "\n\n")
	if !ok || block == "" {
		t.Fatal("config.example.yaml has no commented mcp_servers block")
	}
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "# "))
	}
	uncommented := "mcp_servers:\n" + strings.ReplaceAll(strings.Join(lines, "\n"), "[npx,", "[sh,")
	t.Setenv("SEARCH_MCP_TOKEN", "Bearer x")
	cfg, err := Parse(filepath.Join(t.TempDir(), "agenthost.yaml"), []byte(agentPlugins+uncommented+`
tenants:
  acme:
    builder: b
    model: openai
    mcp_servers: [search, files]
`))
	if err != nil {
		t.Fatalf("%v\nthe block:\n%s", err, uncommented)
	}
	if s := cfg.MCPServers["search"]; s.URL == "" || s.HeadersFromEnv["authorization"] != "SEARCH_MCP_TOKEN" {
		t.Errorf("search: %+v", s)
	}
	if s := cfg.MCPServers["files"]; !s.Stdio() || s.Env["NODE_ENV"] != "production" || s.CallTimeout != DefaultMCPCallTimeout {
		t.Errorf("files: %+v", s)
	}
}
