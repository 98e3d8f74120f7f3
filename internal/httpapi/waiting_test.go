package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// withTimeouts gives acme's Runs a run_timeout and a wait_timeout (0:
// none), and the node a lease long enough that the tests may move the
// fake clock by hours in one step.
func withTimeouts(run, wait time.Duration) envOption {
	return func(_ *httpapi.Config, ropts *runtime.Options) {
		acme := ropts.Tenants.(runtime.TenantMap)["acme"]
		acme.RunTimeout, acme.WaitTimeout = run, wait
		ropts.LeaseTTL = 30 * 24 * time.Hour
	}
}

// runWaiting reads the stream until its next run_waiting event, and
// returns its data, checked against the OpenAPI document, and the events
// before it. A stream that sends none for 20 s is closed: the test fails
// instead of waiting for ever on a Run that waits.
func runWaiting(t *testing.T, api *openAPI, s *sseStream) (httpapi.RunWaitingJSON, []sseEvent) {
	t.Helper()
	giveUp := time.AfterFunc(20*time.Second, s.close)
	defer giveUp.Stop()
	var before []sseEvent
	for {
		ev, ok := s.next()
		require.True(t, ok, "the stream ended, or sent no run_waiting for 20 s; it sent %v", eventTypes(before))
		if ev.Event != "run_waiting" {
			before = append(before, ev)
			continue
		}
		require.Empty(t, ev.ID, "run_waiting is not in the Run's log: it has no id")
		api.validate(api.schemaOf("GET", "/v1/runs/{id}/events", http.StatusOK, "text/event-stream"), "the run_waiting event", []byte(ev.Data))
		var w httpapi.RunWaitingJSON
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &w))
		return w, before
	}
}

// TestRunWaitingNamesTheApprovals: the stream sends run_waiting after the
// event that made the Run wait, naming each tool call that waits for an
// approval with its tool and arguments, since when, and until when
// wait_timeout lets it wait; the Run's JSON shows the same.
func TestRunWaitingNamesTheApprovals(t *testing.T) {
	e := newEnv(t, withTimeouts(0, 2*time.Hour))
	api := loadOpenAPI(t, e)
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w1"}),echo({"text":"e"}),wire({"text":"w2"})|answer:$results`)
	w, before := runWaiting(t, api, e.stream(tokenAcme, run.ID))

	got := e.get(tokenAcme, run.ID)
	require.Equal(t, loop.StatusWaiting, got.Status)
	require.Equal(t, got.Seq, w.Seq, "run_waiting follows the event that made the Run wait")
	require.Equal(t, w.Seq, seqOf(t, before[len(before)-1]))
	require.Equal(t, run.ID, w.Run)
	require.Equal(t, loop.StatusWaiting, w.Status)
	require.Len(t, w.Waiting.Approvals, 2)
	for i, want := range []struct{ call, args string }{{"call_1_1", `{"text":"w1"}`}, {"call_1_3", `{"text":"w2"}`}} {
		a := w.Waiting.Approvals[i]
		require.Equal(t, want.call, a.ToolCallID)
		require.Equal(t, "wire", a.Tool)
		require.JSONEq(t, want.args, string(a.Arguments))
	}
	require.Nil(t, w.Waiting.Input)
	since, err := time.Parse(time.RFC3339, w.Waiting.Since)
	require.NoError(t, err)
	require.True(t, since.Equal(e.clock.Now()), "since %s, want the time of the event that made it wait, %s", since, e.clock.Now())
	deadline, err := time.Parse(time.RFC3339, w.Waiting.Deadline)
	require.NoError(t, err)
	require.Equal(t, 2*time.Hour, deadline.Sub(since), "the deadline is since + wait_timeout")
	require.Equal(t, w.Waiting, got.Waiting, "GET /v1/runs/{id} shows the same waiting")
	require.Equal(t, w.Waiting.Deadline, got.Waiting.WakeAt, "the Run's next timer is the end of its wait")
}

// TestRunWaitingNamesTheQuestion: a Run whose model asks the user a
// question sends run_waiting with the question; a stream that resumes
// at the end of the log of a waiting Run sends it again at once, and a
// stream that resumes after the wait ended sends none.
func TestRunWaitingNamesTheQuestion(t *testing.T) {
	e := newEnv(t)
	api := loadOpenAPI(t, e)
	run := e.submit(tokenAcme, "s1", "ask:Which city?|answer:ok")
	w, _ := runWaiting(t, api, e.stream(tokenAcme, run.ID))
	require.NotNil(t, w.Waiting.Input)
	require.Equal(t, "Which city?", w.Waiting.Input.Prompt)
	require.Empty(t, w.Waiting.Approvals)
	require.NotEmpty(t, w.Waiting.Since)
	require.Empty(t, w.Waiting.Deadline, "no wait_timeout: nothing bounds the wait")

	// Resumed at the Run's last event: what it waits for, at once.
	s := e.stream(tokenAcme, run.ID, "Last-Event-ID", itoa(w.Seq))
	again, before := runWaiting(t, api, s)
	require.Empty(t, before)
	require.Equal(t, w, again)
	s.close()

	// Resumed before the question: the events, then run_waiting.
	s = e.stream(tokenAcme, run.ID, "Last-Event-ID", itoa(w.Seq-2))
	again, before = runWaiting(t, api, s)
	require.Len(t, before, 2)
	require.Equal(t, w, again)
	s.close()

	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "Paris"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	rest := e.stream(tokenAcme, run.ID, "Last-Event-ID", itoa(w.Seq)).all(t)
	require.NotContains(t, eventTypes(rest), "run_waiting", "the wait is over")
	full := e.stream(tokenAcme, run.ID).all(t)
	require.Equal(t, 1, strings.Count(strings.Join(eventTypes(full), " "), "run_waiting"), "one wait, one run_waiting: %v", eventTypes(full))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestRunTimeoutDoesNotCountAWait: a Run with a run_timeout of 10 min
// that waits an hour for an approval goes on and completes: the wait is
// not its work time, and no timer runs for it while it waits.
func TestRunTimeoutDoesNotCountAWait(t *testing.T) {
	e := newEnv(t, withTimeouts(10*time.Minute, 0))
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w"})|answer:$results`)
	w := e.waitRun(tokenAcme, run.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
		return r.Status == loop.StatusWaiting && r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})
	require.Empty(t, w.Waiting.WakeAt, "a Run waiting for a person with no wait_timeout has no timer: its work clock stands still")
	require.Empty(t, w.Waiting.Deadline)

	e.clock.Advance(time.Hour)
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	done := e.waitRun(tokenAcme, run.ID, "to end", func(r httpapi.RunJSON) bool { return r.Status.Terminal() })
	require.Equal(t, loop.StatusCompleted, done.Status, "failure: %+v", done.Failure)
	require.Equal(t, "w", done.Result.Content)
}

// TestRunTimeoutStillBoundsTheWork: the work time around a wait counts;
// past run_timeout the Run fails, and the message says the wait was not
// counted.
func TestRunTimeoutStillBoundsTheWork(t *testing.T) {
	e := newEnv(t, withTimeouts(10*time.Minute, 0))
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w"})|call:slow({"text":"s"})|answer:$results`)
	e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	e.clock.Advance(time.Hour)
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	e.waitRun(tokenAcme, run.ID, "to have its slow tool in flight", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Tool == "slow"
	})
	e.clock.Advance(10 * time.Minute)
	failed := e.waitStatus(tokenAcme, run.ID, loop.StatusFailed)
	require.Equal(t, abi.ClassDeadlineExceeded, failed.Failure.Class)
	require.Contains(t, failed.Failure.Message, "run_timeout of 10m0s passed at")
	require.Contains(t, failed.Failure.Message, "waited 1h0m0s for a person, which run_timeout does not count")
}

// TestWaitTimeoutFailsARunThatWaitsTooLong: a Run that waits for an
// approval, or an answer, for its whole wait_timeout fails when its
// timer fires, with a message naming what it waited for.
func TestWaitTimeoutFailsARunThatWaitsTooLong(t *testing.T) {
	e := newEnv(t, withTimeouts(10*time.Minute, 2*time.Hour))
	approval := e.submit(tokenAcme, "s1", `call:wire({"text":"w"})|answer:$results`)
	question := e.submit(tokenAcme, "s2", "ask:Which city?|answer:ok")
	for _, id := range []string{approval.ID, question.ID} {
		e.waitStatus(tokenAcme, id, loop.StatusWaiting)
	}
	began := e.clock.Now().UTC().Format("2006-01-02T15:04:05Z")

	e.clock.Advance(2*time.Hour - time.Second)
	require.Equal(t, loop.StatusWaiting, e.get(tokenAcme, approval.ID).Status, "a second before wait_timeout")
	e.clock.Advance(time.Second)
	for id, what := range map[string]string{
		approval.ID: "a person's approval of tool call call_1_1 (tool wire)",
		question.ID: "the user's answer to its question",
	} {
		failed := e.waitStatus(tokenAcme, id, loop.StatusFailed)
		require.Equal(t, abi.ClassDeadlineExceeded, failed.Failure.Class)
		require.Equal(t, "wait_timeout of 2h0m0s passed at "+e.clock.Now().UTC().Format("2006-01-02T15:04:05Z")+
			": the Run had waited for "+what+" since "+began, failed.Failure.Message)
	}
}

// nextWhileAdvancing returns the stream's next event, moving the fake
// clock by step at each poll while it waits for one, for an event that
// comes once a timer the test cannot see being armed has fired. It gives
// up after 20 s, closing the stream.
func (e *env) nextWhileAdvancing(s *sseStream, step time.Duration) (sseEvent, bool) {
	type next struct {
		ev sseEvent
		ok bool
	}
	got := make(chan next, 1)
	go func() {
		ev, ok := s.next()
		got <- next{ev, ok}
	}()
	giveUp := time.NewTimer(20 * time.Second)
	defer giveUp.Stop()
	poll := time.NewTicker(50 * time.Millisecond) // a condition poll's cadence
	defer poll.Stop()
	for {
		select {
		case n := <-got:
			return n.ev, n.ok
		case <-poll.C:
			e.clock.Advance(step)
		case <-giveUp.C:
			s.close()
			n := <-got
			return n.ev, false
		}
	}
}

// subAgentScript quotes a script as the JSON arguments of an agent
// tool's call: its '|' are written \u007c, so that the parent's script
// keeps them.
func subAgentScript(s string) string {
	b, _ := json.Marshal(map[string]string{"input": s})
	return strings.ReplaceAll(string(b), "|", `\u007c`)
}

// withSubAgents makes acme two agents: research, with the scripted
// tools, and lead, with them and research as a tool.
func withSubAgents(cfg *httpapi.Config, ropts *runtime.Options) {
	tenants := ropts.Tenants.(runtime.TenantMap)
	acme := tenants["acme"]
	agent := func(name, version string, tools []runtime.Tool) *runtime.Agent {
		return &runtime.Agent{Name: name, Version: version, Builder: acme.Builder, Model: acme.Model, Tools: tools,
			Limits: acme.Limits, ModelPolicy: acme.ModelPolicy}
	}
	research := runtime.Tool{
		Descriptor: abi.Tool{Name: "research", Description: "hand a task to research", Approval: abi.ApprovalNever,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)},
		Spec: loop.ToolSpec{Name: "research", Policy: loop.Policy{Mode: loop.PolicyFail}, Agent: "research"},
	}
	acme.Agents = map[string]*runtime.Agent{
		"research": agent("research", "v-00000000000a", acme.Tools),
		"lead":     agent("lead", "v-00000000000b", append(append([]runtime.Tool(nil), acme.Tools...), research)),
	}
}

// TestAParentShowsItsChildsWait: while the child Run of a parent's agent
// tool waits for an approval, the parent runs on, and its stream sends
// run_waiting naming the child and what it waits for, as the parent's
// JSON shows under waiting.children_waiting. The child began to wait
// after the parent's stream opened: the stream followed it.
func TestAParentShowsItsChildsWait(t *testing.T) {
	e := newEnv(t, withSubAgents)
	api := loadOpenAPI(t, e)
	r := e.submitAs(tokenAcme, "s1", "lead",
		`call:research(`+subAgentScript(`call:slow({"text":"s"})|call:wire({"text":"w"})|answer:research says $results`)+`)|answer:lead says $results`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	parent := r.run(t)
	childID := loop.ChildRunID(parent.ID+".t1.0", 1)

	// The parent's stream, up to its call's pending: the child runs its
	// slow tool then, and the stream follows the child.
	s := e.stream(tokenAcme, parent.ID)
	giveUp := time.AfterFunc(20*time.Second, s.close)
	for {
		ev, ok := s.next()
		require.True(t, ok, "the parent's call of research is not pending after 20 s")
		require.NotEqual(t, "run_waiting", ev.Event, "nothing waits yet")
		if ev.Event == string(loop.EventEffectPending) {
			break
		}
	}
	giveUp.Stop()
	child := e.waitRun(tokenAcme, childID, "to run its slow tool", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Tool == "slow"
	})
	require.Equal(t, "research", child.Agent)
	// Time moves until the slow tool's poll finds it done; the child then
	// waits for its wire call. The parent's log has nothing new: the
	// child waits, not the parent.
	ev, ok := e.nextWhileAdvancing(s, 100*time.Millisecond)
	require.True(t, ok, "the parent's stream sent nothing for 20 s")
	require.Equal(t, "run_waiting", ev.Event, "event %+v", ev)
	require.Empty(t, ev.ID)
	api.validate(api.schemaOf("GET", "/v1/runs/{id}/events", http.StatusOK, "text/event-stream"), "the run_waiting event", []byte(ev.Data))
	var w httpapi.RunWaitingJSON
	require.NoError(t, json.Unmarshal([]byte(ev.Data), &w))
	require.Equal(t, parent.ID, w.Run)
	require.Equal(t, loop.StatusRunning, w.Status)
	require.Empty(t, w.Waiting.Approvals)
	require.Empty(t, w.Waiting.Since, "the parent itself does not wait")
	require.Len(t, w.Waiting.ChildrenWaiting, 1)
	cw := w.Waiting.ChildrenWaiting[0]
	require.Equal(t, childID, cw.Run)
	require.Equal(t, "research", cw.Agent)
	require.Equal(t, "call_1_1", cw.ToolCallID)
	require.Len(t, cw.Waiting.Approvals, 1)
	require.Equal(t, "call_2_1", cw.Waiting.Approvals[0].ToolCallID)
	require.Equal(t, "wire", cw.Waiting.Approvals[0].Tool)
	require.JSONEq(t, `{"text":"w"}`, string(cw.Waiting.Approvals[0].Arguments))
	require.NotEmpty(t, cw.Waiting.Since)

	got := e.get(tokenAcme, parent.ID)
	require.Equal(t, loop.StatusRunning, got.Status)
	require.Equal(t, w.Waiting.ChildrenWaiting, got.Waiting.ChildrenWaiting, "GET /v1/runs/{parent} shows the same")
	api.check("GET", "/v1/runs/{id}", http.StatusOK, e.do("GET", "/v1/runs/"+parent.ID, tokenAcme, ""))

	// A stream of the parent opened now finds the child waiting too.
	late, _ := runWaiting(t, api, e.stream(tokenAcme, parent.ID))
	require.Equal(t, w.Waiting.ChildrenWaiting, late.Waiting.ChildrenWaiting)

	// The approval goes to the child; the parent then completes.
	a := e.do("POST", "/v1/runs/"+childID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_2_1", "approved": true}]}`)
	require.Equal(t, http.StatusOK, a.Status, "body: %s", a.Body)
	rest := s.all(t)
	require.NotContains(t, eventTypes(rest), "run_waiting")
	require.Equal(t, string(loop.EventRunCompleted), rest[len(rest)-1].Event)
	done := e.get(tokenAcme, parent.ID)
	require.Equal(t, "lead says research says slow:s,w", done.Result.Content)
}
