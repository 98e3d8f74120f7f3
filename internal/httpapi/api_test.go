package httpapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance/script"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

func TestSubmitAndGetACompletedRun(t *testing.T) {
	e := newEnv(t)
	r := e.do("POST", "/v1/sessions/s1/runs", tokenAcme,
		`{"input": "call:echo({\"text\":\"a\"})|answer:got $results", "metadata": {"user": "ann"}}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	run := r.run(t)
	require.Equal(t, "/v1/runs/"+run.ID, r.Header.Get("Location"))
	require.Equal(t, "s1", run.Session)
	require.JSONEq(t, `{"user": "ann"}`, string(run.Metadata))
	require.False(t, run.Status.Terminal())

	done := e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	require.NotNil(t, done.Result)
	require.Equal(t, "got a", done.Result.Content)
	require.Nil(t, done.Failure)
	require.Nil(t, done.Waiting)
	require.Equal(t, 2, done.Step)
	require.Equal(t, abi.Usage{InputTokens: 2 * script.StepUsage.InputTokens, OutputTokens: 2 * script.StepUsage.OutputTokens}, done.Usage)
	created, err := time.Parse(time.RFC3339, done.CreatedAt)
	require.NoError(t, err)
	updated, err := time.Parse(time.RFC3339, done.UpdatedAt)
	require.NoError(t, err)
	require.False(t, updated.Before(created))
	require.Equal(t, e.clock.Now().UTC().Year(), created.Year())

	// The raw JSON carries the documented field names.
	raw := e.do("GET", "/v1/runs/"+run.ID, tokenAcme, "")
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw.Body, &fields))
	for _, f := range []string{"id", "session", "status", "usage", "created_at", "updated_at", "step", "result"} {
		require.Contains(t, fields, f)
	}
	require.JSONEq(t, `{"input_tokens": 20, "output_tokens": 10}`, string(fields["usage"]))
	require.JSONEq(t, `{"content": "got a"}`, string(fields["result"]))
}

func TestAFailedRunShowsItsFailure(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "bogus:x") // the scripted model fails on an unknown verb
	failed := e.waitStatus(tokenAcme, run.ID, loop.StatusFailed)
	require.NotNil(t, failed.Failure)
	require.Equal(t, abi.ClassPluginFailed, failed.Failure.Class)
	require.Contains(t, failed.Failure.Message, "unknown verb")
	require.Nil(t, failed.Result)
	require.Nil(t, failed.Waiting)
}

func TestEventStreamOfAFullRun(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", `call:echo({"text":"a"}),echo({"text":"b"})|answer:$results`)
	events := e.stream(tokenAcme, run.ID).all(t) // returns once the stream ends
	require.NotEmpty(t, events)
	for i, ev := range events {
		require.Equal(t, int64(i+1), seqOf(t, ev), "event %d: ids are the seqs, in order, none skipped", i)
		var body loop.Event
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &body))
		require.Equal(t, string(body.Type), ev.Event)
		require.Equal(t, int64(i+1), body.Seq)
	}
	require.Equal(t, string(loop.EventRunCreated), events[0].Event)
	last := events[len(events)-1]
	require.Equal(t, string(loop.EventRunCompleted), last.Event, "the stream ends after the terminal event")
	final := e.get(tokenAcme, run.ID)
	require.Equal(t, loop.StatusCompleted, final.Status)
	require.Equal(t, final.Seq, seqOf(t, last))
	require.Equal(t, "a,b", final.Result.Content)
}

func TestEventStreamResumesAfterLastEventID(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w"})|answer:$results`)
	e.waitRun(tokenAcme, run.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})

	// Read what is there, then leave mid-run.
	s := e.stream(tokenAcme, run.ID)
	waiting := e.get(tokenAcme, run.ID)
	var seen []sseEvent
	for int64(len(seen)) < waiting.Seq {
		ev, ok := s.next()
		require.True(t, ok, "the stream of a waiting Run stays open")
		seen = append(seen, ev)
	}
	s.close()
	lastID := seen[len(seen)-1].ID

	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)

	rest := e.stream(tokenAcme, run.ID, "Last-Event-ID", lastID).all(t)
	require.NotEmpty(t, rest)
	require.Equal(t, seqOf(t, seen[len(seen)-1])+1, seqOf(t, rest[0]), "resume starts right after Last-Event-ID")
	for i := 1; i < len(rest); i++ {
		require.Equal(t, seqOf(t, rest[i-1])+1, seqOf(t, rest[i]))
	}
	require.Equal(t, string(loop.EventRunCompleted), rest[len(rest)-1].Event)
	require.Contains(t, eventTypes(rest), string(loop.EventApprovalRecorded))
	require.NotContains(t, eventTypes(rest), string(loop.EventRunCreated))

	// ?after= does the same without the header.
	afterQ := e.streamQuery(tokenAcme, run.ID, "?after="+lastID)
	require.Equal(t, rest, afterQ)
	// From the start: every event, and the run_waiting after the event
	// that made the Run wait for its approval.
	full := e.stream(tokenAcme, run.ID).all(t)
	require.Len(t, full, len(seen)+len(rest)+1)
	require.Equal(t, "run_waiting", full[len(seen)].Event)
	require.Empty(t, full[len(seen)].ID, "run_waiting is not in the log: it has no id")

	// A bad Last-Event-ID is a 400, not a stream from the start.
	bad := e.do("GET", "/v1/runs/"+run.ID+"/events", tokenAcme, "", "Last-Event-ID", "seven")
	require.Equal(t, http.StatusBadRequest, bad.Status)
	require.Equal(t, httpapi.CodeBadRequest, bad.errCode(t))
}

func (e *env) streamQuery(token, runID, query string) []sseEvent {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.ts.URL+"/v1/runs/"+runID+"/events"+query, nil)
	require.NoError(e.t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := e.ts.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	require.Equal(e.t, http.StatusOK, resp.StatusCode)
	return (&sseStream{resp: resp, sc: bufio.NewScanner(resp.Body)}).all(e.t)
}

func eventTypes(evs []sseEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Event)
	}
	return out
}

func TestEventStreamSendsHeartbeats(t *testing.T) {
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) { c.Heartbeat = 10 * time.Millisecond })
	run := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	s := e.stream(tokenAcme, run.ID)
	go func() {
		for {
			if _, ok := s.next(); !ok {
				return
			}
		}
	}()
	waitFor(t, "a heartbeat comment", func() bool { return s.comments.Load() > 0 })
}

func TestDrainEndsStreamsAndRefusesRequests(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	s := e.stream(tokenAcme, run.ID)
	ended := make(chan []sseEvent)
	go func() { ended <- s.all(t) }()
	e.srv.Drain()
	select {
	case evs := <-ended:
		require.NotEmpty(t, evs)
	case <-time.After(10 * time.Second):
		t.Fatal("the event stream did not end on Drain")
	}
	r := e.do("GET", "/v1/runs/"+run.ID, tokenAcme, "")
	require.Equal(t, http.StatusServiceUnavailable, r.Status)
	require.Equal(t, httpapi.CodeUnavailable, r.errCode(t))
	require.NotEmpty(t, r.Header.Get("Retry-After"))
}

func TestApproveAndDenyByToolCallID(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w1"}),wire({"text":"w2"})|answer:$results`)
	w := e.waitRun(tokenAcme, run.ID, "to wait for two approvals", func(r httpapi.RunJSON) bool {
		return r.Status == loop.StatusWaiting && r.Waiting != nil && len(r.Waiting.Approvals) == 2
	})
	require.Equal(t, "call_1_1", w.Waiting.Approvals[0].ToolCallID)
	require.Equal(t, "wire", w.Waiting.Approvals[0].Tool)
	require.JSONEq(t, `{"text":"w1"}`, string(w.Waiting.Approvals[0].Arguments))
	require.Equal(t, "call_1_2", w.Waiting.Approvals[1].ToolCallID)

	// A tool call the Run does not have: 409, and nothing is recorded.
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_9_9", "approved": true}]}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeUnknownToolCall, r.errCode(t))
	require.Equal(t, w.Seq, e.get(tokenAcme, run.ID).Seq, "a refused approval writes nothing")

	// "approved" is required: a missing one is not a silent denial.
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1"}]}`)
	require.Equal(t, http.StatusBadRequest, r.Status)
	require.Contains(t, r.message(t), `"approved"`)

	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme,
		`{"approvals": [{"tool_call_id": "call_1_1", "approved": true}, {"tool_call_id": "call_1_2", "approved": false, "reason": "not today"}]}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Greater(t, r.run(t).Seq, w.Seq)

	done := e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	require.True(t, strings.HasPrefix(done.Result.Content, "w1,"), "the approved call ran: %q", done.Result.Content)
	require.Contains(t, done.Result.Content, "not today", "the denial reached the model as a tool error")
	require.Equal(t, 1, e.tools.Calls(abi.ExportStart), "only the approved call started")

	// The Run has ended: more approvals are refused.
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeRunTerminal, r.errCode(t))
}

func TestAnswerARunWaitingForInput(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "ask:Which color?|answer:ok")
	w := e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	require.NotNil(t, w.Waiting.Input)
	require.Equal(t, "Which color?", w.Waiting.Input.Prompt)

	// Approvals for a Run that waits for a message: 409.
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Contains(t, []string{httpapi.CodeUnknownToolCall, httpapi.CodeNotAwaiting}, r.errCode(t))

	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "blue"}`)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	done := e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
	require.Equal(t, "ok", done.Result.Content)

	// A message to a Run that asks nothing: 409 not_awaiting.
	other := e.submit(tokenAcme, "s2", `call:wire({})|answer:x`)
	e.waitStatus(tokenAcme, other.ID, loop.StatusWaiting)
	r = e.do("POST", "/v1/runs/"+other.ID+"/input", tokenAcme, `{"message": "hello"}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeNotAwaiting, r.errCode(t))
}

// An answer sent with If-Match applies only to the version of the Run its
// client read: a retry of it cannot answer a later question.
func TestIfMatchMakesAnAnswerSafeToRetry(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "ask:Which city?|ask:Which day?|answer:ok")
	first := e.waitRun(tokenAcme, run.ID, "asks its first question", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && r.Waiting.Input != nil && r.Waiting.Input.Prompt == "Which city?"
	})
	got := e.do("GET", "/v1/runs/"+run.ID, tokenAcme, "")
	require.Equal(t, fmt.Sprintf(`"%d"`, first.Seq), got.Header.Get("ETag"))
	tag := got.Header.Get("ETag")

	// Malformed preconditions: 400, and what to send instead.
	for _, bad := range []string{`W/` + tag, tag + `, "1"`, `12`, `"twelve"`, `""`} {
		r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "Paris"}`, "If-Match", bad)
		require.Equal(t, http.StatusBadRequest, r.Status, "If-Match %s: %s", bad, r.Body)
		require.Contains(t, r.message(t), `If-Match: "12"`)
	}
	// An older version: 412 run_changed, nothing written.
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "Paris"}`, "If-Match", fmt.Sprintf(`"%d"`, first.Seq-1))
	require.Equal(t, http.StatusPreconditionFailed, r.Status, "body: %s", r.Body)
	require.Equal(t, httpapi.CodeRunChanged, r.errCode(t))
	require.Equal(t, first.Seq, e.get(tokenAcme, run.ID).Seq)

	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "Paris"}`, "If-Match", tag)
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.Equal(t, fmt.Sprintf(`"%d"`, r.run(t).Seq), r.Header.Get("ETag"))
	e.waitRun(tokenAcme, run.ID, "asks its second question", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && r.Waiting.Input != nil && r.Waiting.Input.Prompt == "Which day?"
	})
	// The same answer again, as a client retries after a cut-off reply.
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "Paris"}`, "If-Match", tag)
	require.Equal(t, http.StatusPreconditionFailed, r.Status, "body: %s", r.Body)
	require.Equal(t, httpapi.CodeRunChanged, r.errCode(t))

	// "*" is no precondition.
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "Monday"}`, "If-Match", "*")
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
	e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)

	// Cancel takes it too; a stale one is refused before the Run's end is.
	r = e.do("POST", "/v1/runs/"+run.ID+"/cancel", tokenAcme, "", "If-Match", tag)
	require.Equal(t, http.StatusPreconditionFailed, r.Status, "body: %s", r.Body)
}

func TestCancelWithToolsInFlight(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", `call:slow({"text":"x"}),slow({"text":"y"})|answer:$results`)
	w := e.waitRun(tokenAcme, run.ID, "to have two tools in flight", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 2
	})
	require.Equal(t, "slow", w.Waiting.Pending[0].Tool)
	// The model step's attempt leaves the runtime's tracking just after its
	// settlement commits, so wait for the count to come down to the tools.
	waitFor(t, "two effects in flight", func() bool { return e.rt.InFlight("acme") == 2 })

	r := e.do("POST", "/v1/runs/"+run.ID+"/cancel", tokenAcme, `{"reason": "user gave up"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "body: %s", r.Body)
	require.Equal(t, run.ID, r.run(t).ID)

	done := e.waitStatus(tokenAcme, run.ID, loop.StatusCancelled)
	require.Equal(t, 2, e.tools.Calls(abi.ExportCancel), "both executors received cancel")
	require.NotNil(t, done.Failure)
	require.Equal(t, abi.ClassCancelled, done.Failure.Class)

	r = e.do("POST", "/v1/runs/"+run.ID+"/cancel", tokenAcme, "")
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeRunTerminal, r.errCode(t))
}

func TestIdempotencyKeyDeduplicates(t *testing.T) {
	e := newEnv(t)
	body := `{"input": "answer:once"}`
	first := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body, "Idempotency-Key", "key-123")
	require.Equal(t, http.StatusCreated, first.Status)
	require.Empty(t, first.Header.Get(httpapi.ReplayedHeader))
	again := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body, "Idempotency-Key", "key-123")
	require.Equal(t, http.StatusOK, again.Status, "body: %s", again.Body)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, first.run(t).ID, again.run(t).ID)

	other := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body, "Idempotency-Key", "key-456")
	require.Equal(t, http.StatusCreated, other.Status)
	require.NotEqual(t, first.run(t).ID, other.run(t).ID)

	// The key is the tenant's: another tenant's same key makes its own Run.
	g := e.do("POST", "/v1/sessions/s1/runs", tokenGlobex, body, "Idempotency-Key", "key-123")
	require.Equal(t, http.StatusCreated, g.Status)

	list := e.do("GET", "/v1/sessions/s1/runs", tokenAcme, "")
	require.Equal(t, http.StatusOK, list.Status)
	var page httpapi.SessionRunsJSON
	require.NoError(t, json.Unmarshal(list.Body, &page))
	require.Len(t, page.Runs, 2, "the replay created nothing")

	bad := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body, "Idempotency-Key", "has space")
	require.Equal(t, http.StatusBadRequest, bad.Status)
	require.Equal(t, httpapi.CodeBadRequest, bad.errCode(t))
}

func TestAnotherTenantsRunAnswers404(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	before := e.get(tokenAcme, run.ID)

	missing := "run_doesnotexist"
	for _, c := range []struct{ method, suffix, body string }{
		{"GET", "", ""},
		{"GET", "/events", ""},
		{"POST", "/input", `{"message": "hijack"}`},
		{"POST", "/cancel", `{"reason": "hijack"}`},
	} {
		theirs := e.do(c.method, "/v1/runs/"+run.ID+c.suffix, tokenGlobex, c.body)
		require.Equal(t, http.StatusNotFound, theirs.Status, "%s %s", c.method, c.suffix)
		require.Equal(t, httpapi.CodeRunNotFound, theirs.errCode(t))
		none := e.do(c.method, "/v1/runs/"+missing+c.suffix, tokenGlobex, c.body)
		require.Equal(t, http.StatusNotFound, none.Status)
		// Each answer has its own request ID; all else is the same.
		same := func(r reply, id string) string {
			return strings.NewReplacer(id, "ID", r.Header.Get(httpapi.RequestIDHeader), "REQUEST").Replace(string(r.Body))
		}
		require.Equal(t, same(none, missing), same(theirs, run.ID), "another tenant's Run looks exactly like a missing one")
	}
	list := e.do("GET", "/v1/sessions/s1/runs", tokenGlobex, "")
	require.Equal(t, http.StatusNotFound, list.Status)
	require.Equal(t, httpapi.CodeSessionNotFound, list.errCode(t))

	after := e.get(tokenAcme, run.ID)
	require.Equal(t, before.Seq, after.Seq, "nothing reached the Run")
	require.Equal(t, loop.StatusWaiting, after.Status)
}

func TestTokensAreRequired(t *testing.T) {
	e := newEnv(t)
	for _, h := range []string{"", "Bearer", "Bearer nope", "Basic " + tokenAcme, "bearer  "} {
		req, _ := http.NewRequest("GET", e.ts.URL+"/v1/sessions/s1/runs", nil)
		if h != "" {
			req.Header.Set("Authorization", h)
		}
		resp, err := e.ts.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "Authorization %q", h)
		require.Contains(t, resp.Header.Get("WWW-Authenticate"), "Bearer")
	}
	r := e.do("POST", "/v1/sessions/s1/runs", "", `{"input": "answer:x"}`)
	require.Equal(t, http.StatusUnauthorized, r.Status)
	require.Equal(t, httpapi.CodeUnauthorized, r.errCode(t))
	require.Equal(t, http.StatusOK, e.do("GET", "/healthz", "", "").Status)
}

func TestQuotaActiveRuns(t *testing.T) {
	e := newEnv(t, withQuota("acme", httpapi.Quota{MaxActiveRuns: 2}))
	a := e.submit(tokenAcme, "s1", "ask:Which?|answer:ok")
	e.submit(tokenAcme, "s2", "ask:Which?|answer:ok")
	r := e.do("POST", "/v1/sessions/s3/runs", tokenAcme, `{"input": "answer:x"}`)
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, httpapi.CodeQuotaActiveRuns, r.errCode(t))
	require.Contains(t, r.message(t), "active runs")
	require.NotEmpty(t, r.Header.Get("Retry-After"))

	// Another tenant has its own quota.
	e.submit(tokenGlobex, "s3", "answer:x")

	// Once a Run ends, there is room again.
	require.Equal(t, http.StatusAccepted, e.do("POST", "/v1/runs/"+a.ID+"/cancel", tokenAcme, "").Status)
	e.waitStatus(tokenAcme, a.ID, loop.StatusCancelled)
	e.submit(tokenAcme, "s3", "answer:x")
}

func TestQuotaInFlightEffects(t *testing.T) {
	e := newEnv(t, withQuota("acme", httpapi.Quota{MaxInFlightEffects: 1}))
	run := e.submit(tokenAcme, "s1", `call:slow({"text":"x"})|answer:$results`)
	e.waitRun(tokenAcme, run.ID, "to have a tool in flight", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1
	})
	r := e.do("POST", "/v1/sessions/s2/runs", tokenAcme, `{"input": "answer:x"}`)
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, httpapi.CodeQuotaInFlight, r.errCode(t))
	require.NotEmpty(t, r.Header.Get("Retry-After"))
}

func TestQuotaTokenBudget(t *testing.T) {
	perRun := script.StepUsage.InputTokens + script.StepUsage.OutputTokens
	e := newEnv(t, withQuota("acme", httpapi.Quota{TokenBudget: 2*perRun - 1}))
	for i, s := range []string{"s1", "s2"} {
		run := e.submit(tokenAcme, s, "answer:hi")
		e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
		waitFor(t, "the ledger to count the run", func() bool {
			used, err := e.ledger.Used(t.Context(), e.store, "acme")
			return err == nil && used == int64(i+1)*perRun
		})
	}
	r := e.do("POST", "/v1/sessions/s3/runs", tokenAcme, `{"input": "answer:x"}`)
	require.Equal(t, http.StatusTooManyRequests, r.Status, "body: %s", r.Body)
	require.Equal(t, httpapi.CodeQuotaTokens, r.errCode(t))
	require.Contains(t, r.message(t), "token budget")
	require.NotEmpty(t, r.Header.Get("Retry-After"))

	// A fresh ledger over the same store finds the usage again.
	fresh := httpapi.NewUsageLedger()
	used, err := fresh.Used(t.Context(), e.store, "acme")
	require.NoError(t, err)
	require.Equal(t, 2*perRun, used)
	used, err = fresh.Used(t.Context(), e.store, "globex")
	require.NoError(t, err)
	require.Zero(t, used)
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) { c.MaxBodyBytes = 64 })
	big := `{"input": "` + strings.Repeat("x", 200) + `"}`
	r := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, big)
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Status)
	require.Equal(t, httpapi.CodeTooLarge, r.errCode(t))
	list := e.do("GET", "/v1/sessions/s1/runs", tokenAcme, "")
	require.Equal(t, http.StatusNotFound, list.Status, "nothing was created")
}

func TestMalformedRequests(t *testing.T) {
	e := newEnv(t)
	waiting := e.submit(tokenAcme, "s0", "ask:Which?|answer:ok")
	e.waitStatus(tokenAcme, waiting.ID, loop.StatusWaiting)
	for _, c := range []struct {
		name, method, path, body string
		code                     string
	}{
		{"not json", "POST", "/v1/sessions/s1/runs", `{`, httpapi.CodeBadRequest},
		{"an array", "POST", "/v1/sessions/s1/runs", `[]`, httpapi.CodeBadRequest},
		{"empty body", "POST", "/v1/sessions/s1/runs", ``, httpapi.CodeBadRequest},
		{"no input", "POST", "/v1/sessions/s1/runs", `{"metadata": {}}`, httpapi.CodeBadRequest},
		{"input not a string", "POST", "/v1/sessions/s1/runs", `{"input": 3}`, httpapi.CodeBadRequest},
		{"metadata not an object", "POST", "/v1/sessions/s1/runs", `{"input": "x", "metadata": [1]}`, httpapi.CodeBadRequest},
		{"unknown field", "POST", "/v1/sessions/s1/runs", `{"input": "x", "priority": 1}`, httpapi.CodeUnknownField},
		{"trailing data", "POST", "/v1/sessions/s1/runs", `{"input": "x"} {}`, httpapi.CodeBadRequest},
		{"bad session id", "POST", "/v1/sessions/has.dot/runs", `{"input": "x"}`, httpapi.CodeInvalidSession},
		{"session id too long", "POST", "/v1/sessions/" + strings.Repeat("a", 65) + "/runs", `{"input": "x"}`, httpapi.CodeInvalidSession},
		{"bad session id on list", "GET", "/v1/sessions/has.dot/runs", ``, httpapi.CodeInvalidSession},
		{"input: both kinds", "POST", "/v1/runs/" + waiting.ID + "/input", `{"message": "a", "approvals": [{"tool_call_id": "c", "approved": true}]}`, httpapi.CodeBadRequest},
		{"input: neither", "POST", "/v1/runs/" + waiting.ID + "/input", `{}`, httpapi.CodeBadRequest},
		{"input: unknown field", "POST", "/v1/runs/" + waiting.ID + "/input", `{"msg": "a"}`, httpapi.CodeUnknownField},
		{"input: approved not a bool", "POST", "/v1/runs/" + waiting.ID + "/input", `{"approvals": [{"tool_call_id": "c", "approved": "yes"}]}`, httpapi.CodeBadRequest},
		{"cancel: unknown field", "POST", "/v1/runs/" + waiting.ID + "/cancel", `{"why": "x"}`, httpapi.CodeUnknownField},
		{"list: bad limit", "GET", "/v1/sessions/s0/runs?limit=0", ``, httpapi.CodeBadRequest},
		{"list: bad after", "GET", "/v1/sessions/s0/runs?after=-1", ``, httpapi.CodeBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do(c.method, c.path, tokenAcme, c.body)
			require.Equal(t, http.StatusBadRequest, r.Status, "body: %s", r.Body)
			require.Equal(t, c.code, r.errCode(t))
		})
	}
	// Nothing reached the waiting Run, and no Run was created in s1.
	require.Equal(t, loop.StatusWaiting, e.get(tokenAcme, waiting.ID).Status)
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/sessions/s1/runs", tokenAcme, "").Status)
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	e := newEnv(t)
	r := e.do("DELETE", "/v1/runs/abc", tokenAcme, "")
	require.Equal(t, http.StatusMethodNotAllowed, r.Status)
	require.Equal(t, httpapi.CodeMethod, r.errCode(t))
	require.Contains(t, r.Header.Get("Allow"), "GET")

	r = e.do("GET", "/v2/things", tokenAcme, "")
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, httpapi.CodeNotFound, r.errCode(t))

	r = e.do("GET", "/v1/runs/bad.id", tokenAcme, "")
	require.Equal(t, http.StatusNotFound, r.Status)
	require.Equal(t, httpapi.CodeRunNotFound, r.errCode(t))
}

func TestReadyzFollowsTheReadinessFunc(t *testing.T) {
	e := newEnv(t)
	e.ready.Store(false)
	r := e.do("GET", "/readyz", "", "")
	require.Equal(t, http.StatusServiceUnavailable, r.Status)
	require.Equal(t, httpapi.CodeUnavailable, r.errCode(t))
	require.Equal(t, http.StatusOK, e.do("GET", "/healthz", "", "").Status, "healthz answers while not ready")
	e.ready.Store(true)
	require.Equal(t, http.StatusOK, e.do("GET", "/readyz", "", "").Status)
}

// A draining server answers every /v1 call with 503, so a load balancer
// that routes on /readyz must see it not ready too, and send the calls to
// the other nodes; /healthz still answers while it drains.
func TestReadyzIsNotReadyWhileDraining(t *testing.T) {
	e := newEnv(t)
	require.Equal(t, http.StatusOK, e.do("GET", "/readyz", "", "").Status)
	e.srv.Drain()
	r := e.do("GET", "/readyz", "", "")
	require.Equal(t, http.StatusServiceUnavailable, r.Status)
	require.Equal(t, httpapi.CodeUnavailable, r.errCode(t))
	require.Contains(t, string(r.Body), "stopping")
	require.Equal(t, http.StatusOK, e.do("GET", "/healthz", "", "").Status, "healthz answers while draining")
}

func TestSessionRunsArePagedInOrder(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, e.submit(tokenAcme, "s1", "answer:x").ID)
	}
	var page httpapi.SessionRunsJSON
	r := e.do("GET", "/v1/sessions/s1/runs?limit=2", tokenAcme, "")
	require.Equal(t, http.StatusOK, r.Status)
	require.NoError(t, json.Unmarshal(r.Body, &page))
	require.Len(t, page.Runs, 2)
	require.Equal(t, ids[0], page.Runs[0].ID)
	require.Equal(t, int64(1), page.Runs[0].Ordinal)
	require.Equal(t, ids[1], page.Runs[1].ID)
	require.NotNil(t, page.NextAfter)
	require.Equal(t, int64(2), *page.NextAfter)

	r = e.do("GET", "/v1/sessions/s1/runs?limit=2&after=2", tokenAcme, "")
	page = httpapi.SessionRunsJSON{}
	require.NoError(t, json.Unmarshal(r.Body, &page))
	require.Len(t, page.Runs, 1)
	require.Equal(t, ids[2], page.Runs[0].ID)
	require.Nil(t, page.NextAfter)

	r = e.do("GET", "/v1/sessions/s1/runs?after=10", tokenAcme, "")
	require.Equal(t, http.StatusOK, r.Status)
	page = httpapi.SessionRunsJSON{}
	require.NoError(t, json.Unmarshal(r.Body, &page))
	require.Empty(t, page.Runs)
}

func TestEveryRequestIsLogged(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", "answer:x")
	e.do("GET", "/v1/runs/"+run.ID, "", "")
	logs := e.logs.String()
	var sawSubmit, sawUnauthorized bool
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "line %q", line)
		if rec["msg"] != "http request" {
			continue
		}
		require.Contains(t, rec, "duration")
		if rec["method"] == "POST" && rec["path"] == "/v1/sessions/s1/runs" {
			sawSubmit = rec["status"] == float64(201) && rec["tenant"] == "acme" && rec["level"] == "INFO"
		}
		if rec["path"] == "/v1/runs/"+run.ID && rec["status"] == float64(401) {
			sawUnauthorized = true
		}
	}
	require.True(t, sawSubmit, "logs: %s", logs)
	require.True(t, sawUnauthorized, "logs: %s", logs)
}

// waitFor waits for cond with a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
