package mcptool_test

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/mcptasks"
	"github.com/agenthost/agenthost/internal/mcptool"
	"github.com/agenthost/agenthost/plugins/abi"
)

// everythingDir holds the package.json and package-lock.json that pin the
// MCP reference server, @modelcontextprotocol/server-everything (on the
// official TypeScript SDK).
const everythingDir = "testdata/everything"

// everythingMain installs the reference server (npm ci, once) and returns
// its entry point.
func everythingMain(t *testing.T) string {
	t.Helper()
	conformance.SkipInShort(t, "the MCP reference server from npm")
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("the MCP reference server needs node: apt-get install -y nodejs npm (make deps does it)")
	}
	conformance.NPMCI(t, everythingDir, "@modelcontextprotocol/server-everything")
	main, err := filepath.Abs(filepath.Join(everythingDir, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	return main
}

// TestTheReferenceServerAsAToolSource: the MCP reference server, over
// stdio (started by the host) and over streamable HTTP, is a source of
// tools: its tools are listed with their schemas, a plain tool answers,
// and its task tool (taskSupport required) runs as a task, polled with
// tasks/get to its end and read with tasks/result.
func TestTheReferenceServerAsAToolSource(t *testing.T) {
	main := everythingMain(t)
	port := freePort(t)
	httpProc := exec.Command("node", main, "streamableHttp")
	httpProc.Env = append(os.Environ(), "PORT="+strconv.Itoa(port))
	if err := httpProc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { httpProc.Process.Kill(); httpProc.Wait() })

	stdio := httpServer("refstdio", "")
	stdio.Command = []string{"node", main, "stdio"}
	mgr, _ := start(t, mcptool.Options{}, stdio, httpServer("refhttp", "http://127.0.0.1:"+strconv.Itoa(port)+"/mcp"))
	for _, name := range []string{"refstdio", "refhttp"} {
		t.Run(name, func(t *testing.T) {
			s := mgr.Server(name)
			sum := waitTools(t, s, name+"__get-sum")
			research := waitTools(t, s, name+"__simulate-research-query")
			if research.TaskSupport != mcptasks.TaskRequired {
				t.Errorf("simulate-research-query's task support: %q, want required", research.TaskSupport)
			}
			if !strings.Contains(string(sum.Descriptor.InputSchema), `"a"`) {
				t.Errorf("get-sum's schema: %s", sum.Descriptor.InputSchema)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r, err := s.Executor("get-sum").Start(ctx, call(sum.Name, `{"a":2,"b":3}`, ""))
			if err != nil || r.State != abi.StateDone || !strings.Contains(string(r.Outcome), "The sum of 2 and 3 is 5.") {
				t.Fatalf("get-sum: %+v (%s) %v", r, r.Outcome, err)
			}
			ex := s.Executor("simulate-research-query")
			r, err = ex.Start(ctx, call(research.Name, `{"topic":"durable runs"}`, ""))
			if err != nil || r.State != abi.StatePending || r.Handle == "" {
				t.Fatalf("simulate-research-query: %+v %v; want pending with the task's ID", r, err)
			}
			handle := r.Handle
			conformance.WaitUntil(t, 45*time.Second, "the research task to end", func() (bool, error) {
				r, err = ex.Poll(ctx, call(research.Name, `{"topic":"durable runs"}`, handle))
				return r.State != abi.StatePending, err
			})
			var o abi.ToolOutcome
			if r.State != abi.StateDone || json.Unmarshal(r.Outcome, &o) != nil || o.IsError || !strings.Contains(o.Content, "durable runs") {
				t.Fatalf("the research task ended %+v (%s)", r, r.Outcome)
			}
		})
	}
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
