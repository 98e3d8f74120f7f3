package main

import (
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
)

// subAgentRunView is the part of a Run's JSON the sub-agent tests read.
type subAgentRunView struct {
	runView
	Agent  string `json:"agent"`
	Parent *struct {
		Run   string `json:"run"`
		Depth int    `json:"depth"`
	} `json:"parent"`
	Children []struct {
		Run     string `json:"run"`
		Agent   string `json:"agent"`
		Attempt int    `json:"attempt"`
	} `json:"children"`
}

func (c *apiClient) subAgentRun(t *testing.T, id string) subAgentRunView {
	t.Helper()
	var run subAgentRunView
	code, raw, err := c.Do("GET", "/v1/runs/"+id, nil, nil, &run)
	if err != nil || code != http.StatusOK {
		t.Fatalf("get run %s: %d %v %s", id, code, err, raw)
	}
	return run
}

// leadInput is the input of a Run of the agent lead (slowJobServeConfig)
// that hands research a slow job of the given length, through the
// scripted model's explicit form.
func leadInput(seconds string) string {
	return `use research {"input": "Please run a slow job for ` + seconds + ` seconds"}`
}

// childOf waits until the parent Run has a child Run, through whichever
// client, and returns the child's ID.
func childOf(t *testing.T, c *apiClient, parent string) string {
	t.Helper()
	var child string
	waitUntil(t, 60*time.Second, "a child run of "+parent, func() (bool, error) {
		run := c.subAgentRun(t, parent)
		if len(run.Children) > 0 {
			child = run.Children[0].Run
		}
		return child != "", nil
	})
	return child
}

// TestASubAgentSurvivesKill9: the agent lead calls research as a tool;
// serve is SIGKILLed while the child Run waits on a slow job, and
// restarted on the same data. Both Runs complete; the child exists once
// (one child of the parent, one Run of research); the parent's agent-tool
// call was dispatched once (recovery attached to the child rather than
// start another); the slow job ran once; both logs pass loop.CheckEnded;
// and the child's usage is in the parent's.
func TestASubAgentSurvivesKill9(t *testing.T) {
	conformance.SkipInShort(t, "SIGKILLing serve with a child Run in flight")
	bin := buildBinary(t)
	const token = "subagent-token"
	dir := t.TempDir()
	cfgPath := slowJobServeConfig(t, dir, token, "")
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 80)
	proc := startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	c := newClient(proc.Addr(), token)

	var parent subAgentRunView
	code, raw, err := c.Do("POST", "/v1/sessions/lead-1/runs", map[string]any{"input": leadInput("4"), "agent": "lead"}, nil, &parent)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("submit as lead: %d %v %s", code, err, raw)
	}
	childID := childOf(t, c, parent.ID)
	c.waitRun(t, childID, 60*time.Second, "a slow job in flight", pendingSlowJob)

	if err := proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mustExit(t, proc, 30*time.Second)
	proc = startServe(t, bin, cfgPath, logPath)
	mustReady(t, proc, 60*time.Second)
	c = newClient(proc.Addr(), token)

	c.waitRun(t, parent.ID, 90*time.Second, "terminal", runView.terminal)
	p, child := c.subAgentRun(t, parent.ID), c.subAgentRun(t, childID)
	if p.Status != "completed" || child.Status != "completed" {
		t.Fatalf("after the kill: parent %s %+v, child %s %+v; want both completed", p.Status, p.Failure, child.Status, child.Failure)
	}
	if len(p.Children) != 1 || p.Children[0].Run != childID || p.Children[0].Agent != "research" || p.Children[0].Attempt != 1 {
		t.Fatalf("the parent's children: %+v, want one, %s of research", p.Children, childID)
	}
	if child.Parent == nil || child.Parent.Run != parent.ID || child.Parent.Depth != 1 || child.Agent != "research" || child.Session != childID {
		t.Fatalf("the child: agent %s in session %s, parent %+v", child.Agent, child.Session, child.Parent)
	}
	if !strings.Contains(p.Result.Content, "slow") {
		t.Errorf("the parent's answer %q does not carry the child's", p.Result.Content)
	}
	if p.Usage.InputTokens <= child.Usage.InputTokens || child.Usage.InputTokens == 0 {
		t.Errorf("the parent's usage %+v does not include its child's %+v", p.Usage, child.Usage)
	}
	var list struct {
		Runs []struct {
			ID string `json:"id"`
		} `json:"runs"`
	}
	if code, raw, err := c.Do("GET", "/v1/runs?agent=research", nil, nil, &list); err != nil || code != http.StatusOK {
		t.Fatalf("GET /v1/runs?agent=research: %d %v %s", code, err, raw)
	}
	if len(list.Runs) != 1 || list.Runs[0].ID != childID {
		t.Errorf("research has Runs %+v, want the one child %s", list.Runs, childID)
	}

	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := mustExit(t, proc, 60*time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM", code)
	}
	store, err := badgerstore.Open(filepath.Join(dir, "data"), badgerstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	jobs := checkServedRuns(t, store, []string{parent.ID, childID})
	if jobs != 1 {
		t.Errorf("%d slow jobs checked, want the child's one", jobs)
	}
}
