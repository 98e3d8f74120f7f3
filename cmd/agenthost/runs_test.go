package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cli runs the agenthost command in this process and returns its stdout
// and error.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	t.Logf("agenthost %s → %v\n%s", strings.Join(args, " "), err, out.String())
	return out.String(), err
}

// TestRunsCLI drives a real server through `agenthost runs`: list, show,
// events (with a resume), approve, deny, input, cancel, and the server's
// errors shown as it sent them.
func TestRunsCLI(t *testing.T) {
	dir := t.TempDir()
	cfg := e2eConfig(t, dir)
	logTailOnFailure(t, filepath.Join(dir, "serve.log"), 60)
	srv := startInProcess(t, cfg)
	acme := newClient(srv.Addr(), acmeToken)
	flags := []string{"--server", "http://" + srv.Addr(), "--token", acmeToken}
	runs := func(args ...string) (string, error) {
		return cli(t, append(append([]string{"runs"}, args...), flags...)...)
	}

	done := acme.submit(t, "cli", `call:echo({"text":"hi"})|answer:got $results`)
	acme.waitRun(t, done.ID, 30*time.Second, "terminal", runView.terminal)
	out, err := runs("list", "--session", "cli")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "runs list", out, "RUN", done.ID, "completed", "call:echo")

	out, err = runs("show", done.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "runs show", out, "run "+done.ID+" (session cli): completed", "answer: got", "usage: 20 input tokens, 10 output tokens")

	out, err = runs("events", done.ID)
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "runs events", out, "run "+done.ID+" (tenant acme, session cli)", "model calls echo", "tool echo returned", "answer: got", "run completed")
	out, err = runs("events", done.ID, "--after", "3", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `"id":"3"`) || !strings.Contains(out, `"id":"4"`) || !strings.Contains(out, `"event":"run_completed"`) {
		t.Errorf("events --after 3 --json:\n%s", out)
	}

	for _, deny := range []bool{false, true} {
		gated := acme.submit(t, fmt.Sprintf("cli-gated-%v", deny), `call:wire({"n":1})|answer:results=$results`)
		w := acme.waitRun(t, gated.ID, 30*time.Second, "waiting", func(r runView) bool { return r.Waiting != nil && len(r.Waiting.Approvals) == 1 })
		call := w.Waiting.Approvals[0].ToolCallID
		out, err = runs("show", gated.ID)
		if err != nil {
			t.Fatal(err)
		}
		mustContain(t, "runs show (waiting)", out, "waiting: tool wire", "agenthost runs approve "+gated.ID+" --call "+call)
		args := []string{"approve", gated.ID, "--call", call}
		if deny {
			args = append(args, "--deny", "--reason", "not today")
		}
		if _, err := runs(args...); err != nil {
			t.Fatal(err)
		}
		r := acme.waitRun(t, gated.ID, 30*time.Second, "terminal", runView.terminal)
		if got := strings.Contains(r.Result.Content, "denied: not today"); got != deny {
			t.Errorf("deny=%v: the answer is %q", deny, r.Result.Content)
		}
	}

	asked := acme.submit(t, "cli-ask", "ask:Your name?|answer:thanks")
	waiting := acme.waitRun(t, asked.ID, 30*time.Second, "waiting for input", func(r runView) bool { return r.Waiting != nil && r.Waiting.Input != nil })
	stale := strconv.FormatInt(waiting.Seq-1, 10)
	if out, err := runs("input", asked.ID, "--message", "Ada", "--if-seq", stale); err == nil || !strings.Contains(err.Error(), "run_changed") {
		t.Fatalf("an answer with an older --if-seq: %v\n%s", err, out)
	}
	if _, err := runs("input", asked.ID, "--message", "Ada", "--if-seq", strconv.FormatInt(waiting.Seq, 10)); err != nil {
		t.Fatal(err)
	}
	if r := acme.waitRun(t, asked.ID, 30*time.Second, "terminal", runView.terminal); r.Status != "completed" {
		t.Errorf("after input: %+v", r)
	}

	long := acme.submit(t, "cli-cancel", `call:slow_job({"seconds":300})|answer:never`)
	out, err = runs("cancel", long.ID, "--reason", "enough")
	if err != nil {
		t.Fatal(err)
	}
	mustContain(t, "runs cancel", out, "run "+long.ID)
	if r := acme.waitRun(t, long.ID, 30*time.Second, "terminal", runView.terminal); r.Status != "cancelled" {
		t.Errorf("after cancel: %+v", r)
	}

	// The server's errors, as it sent them.
	_, err = runs("show", "run_doesnotexist")
	if err == nil || !strings.Contains(err.Error(), "404 run_not_found") {
		t.Errorf("an unknown Run: %v", err)
	}
	_, err = runs("cancel", long.ID)
	if err == nil || !strings.Contains(err.Error(), "409 run_terminal") {
		t.Errorf("cancelling an ended Run: %v", err)
	}
	_, err = cli(t, "runs", "show", done.ID, "--server", "http://"+srv.Addr(), "--token", "wrong")
	if err == nil || !strings.Contains(err.Error(), "401 unauthorized") {
		t.Errorf("a wrong token: %v", err)
	}
	t.Setenv("AGENTHOST_TOKEN", "")
	_, err = cli(t, "runs", "show", done.ID, "--server", "http://"+srv.Addr())
	if err == nil || !strings.Contains(err.Error(), "pass --token TOKEN or set AGENTHOST_TOKEN") {
		t.Errorf("no token: %v", err)
	}
	if code := execute([]string{"runs", "show", "run_doesnotexist", "--server", "http://" + srv.Addr(), "--token", acmeToken}); code != 1 {
		t.Errorf("exit code %d for a failure, want 1", code)
	}
}
