package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// An Idempotency-Key names one submission (the IETF idempotency-key
// draft): a retry of it gets the Run back, and the key sent with another
// body or to another session answers 422 and creates nothing. Another
// tenant's key is its own.
func TestIdempotencyKeyReusedForAnotherSubmissionIs422(t *testing.T) {
	e := newEnv(t)
	const key = "order-42"
	first := e.do("POST", "/v1/sessions/s1/runs", tokenAcme,
		`{"input": "answer:one", "metadata": {"user": "ann", "tags": [1, 2.5, "x"], "n": {"deep": true}}}`, "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, first.Status, "body: %s", first.Body)
	id := first.run(t).ID

	// A replay: the same JSON, spaced, ordered and escaped differently.
	again := e.do("POST", "/v1/sessions/s1/runs", tokenAcme,
		`{"metadata":{"n":{"deep":true},"tags":[1,2.5,"\u0078"],"user":"ann"},"input":"answer:one"}`, "Idempotency-Key", key)
	require.Equal(t, http.StatusOK, again.Status, "body: %s", again.Body)
	require.Equal(t, "true", again.Header.Get(httpapi.ReplayedHeader))
	require.Equal(t, id, again.run(t).ID)

	for _, c := range []struct {
		name, session, body, differs string
	}{
		{"another input", "s1", `{"input": "answer:two", "metadata": {"user": "ann", "tags": [1, 2.5, "x"], "n": {"deep": true}}}`, "input"},
		{"other metadata", "s1", `{"input": "answer:one", "metadata": {"user": "bob", "tags": [1, 2.5, "x"], "n": {"deep": true}}}`, "metadata"},
		{"no metadata", "s1", `{"input": "answer:one"}`, "metadata"},
		{"a number written otherwise", "s1", `{"input": "answer:one", "metadata": {"user": "ann", "tags": [1.0, 2.5, "x"], "n": {"deep": true}}}`, "metadata"},
		{"another session", "s2", `{"input": "answer:one", "metadata": {"user": "ann", "tags": [1, 2.5, "x"], "n": {"deep": true}}}`, `session (it was "s1")`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", "/v1/sessions/"+c.session+"/runs", tokenAcme, c.body, "Idempotency-Key", key)
			require.Equal(t, http.StatusUnprocessableEntity, r.Status, "body: %s", r.Body)
			require.Equal(t, httpapi.CodeKeyReused, r.errCode(t))
			msg := r.message(t)
			require.Contains(t, msg, "different "+c.differs)
			require.Contains(t, msg, "new Idempotency-Key")
			require.Contains(t, msg, id)
			require.Empty(t, r.Header.Get(httpapi.ReplayedHeader))
		})
	}
	require.Len(t, listAll(t, e, tokenAcme, "s1", 50), 1, "nothing was created in s1")
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/sessions/s2/runs", tokenAcme, "").Status, "nothing was created in s2")

	// Another tenant's same key, with another body, is another submission.
	g := e.do("POST", "/v1/sessions/s1/runs", tokenGlobex, `{"input": "answer:theirs"}`, "Idempotency-Key", key)
	require.Equal(t, http.StatusCreated, g.Status, "body: %s", g.Body)
	require.NotEqual(t, id, g.run(t).ID)
	require.Equal(t, "answer:one", e.get(tokenAcme, id).Input, "acme's Run is untouched")
}

// Request bodies are read strictly: UTF-8 only, no key twice, field names
// as documented (not ignoring case), metadata at most 64 levels deep, and
// declared as JSON or not declared. A refused body creates nothing.
func TestStrictRequestBodies(t *testing.T) {
	e := newEnv(t)
	waiting := e.submit(tokenAcme, "s0", `call:wire({"text":"w"})|answer:$results`)
	e.waitRun(tokenAcme, waiting.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})
	submit := "/v1/sessions/s1/runs"
	input := "/v1/runs/" + waiting.ID + "/input"
	for _, c := range []struct {
		name, path, body string
		header           []string
		status           int
		code             string
		says             []string
	}{
		{"invalid UTF-8 in metadata", submit, "{\"input\": \"answer:x\", \"metadata\": {\"k\": \"\xff\xfe\"}}", nil,
			400, httpapi.CodeBadRequest, []string{"UTF-8", "at byte 41"}},
		{"invalid UTF-8 in input", submit, "{\"input\": \"answer:\xc3\"}", nil, 400, httpapi.CodeBadRequest, []string{"UTF-8"}},
		{"invalid UTF-8 in a message", input, "{\"message\": \"\xed\xa0\x80\"}", nil, 400, httpapi.CodeBadRequest, []string{"UTF-8"}},
		{"a lone surrogate escaped", submit, `{"input": "answer:x", "metadata": {"k": "\ud800"}}`, nil,
			400, httpapi.CodeBadRequest, []string{"surrogate", `\ud800`}},
		{"metadata 65 levels deep", submit, `{"input": "answer:x", "metadata": ` + nested(65) + `}`, nil,
			400, httpapi.CodeBadRequest, []string{`"metadata`, "64 levels"}},
		{"an input nested instead of a string", submit, `{"input": ` + nested(200) + `}`, nil,
			400, httpapi.CodeBadRequest, []string{"64 levels"}},
		{"a key twice in the body", submit, `{"input": "answer:x", "input": "answer:y"}`, nil,
			400, httpapi.CodeBadRequest, []string{`"input" appears twice`, "the request body"}},
		{"a key twice in metadata", submit, `{"input": "answer:x", "metadata": {"a": [{"b": 1, "c": 2, "b": 3}]}}`, nil,
			400, httpapi.CodeBadRequest, []string{`"b" appears twice`, `"metadata.a[0]"`}},
		{"a key twice in an approval", input, `{"approvals": [{"tool_call_id": "call_1_1", "approved": false, "approved": true}]}`, nil,
			400, httpapi.CodeBadRequest, []string{`"approved" appears twice`, `"approvals[0]"`}},
		{"INPUT", submit, `{"INPUT": "answer:x"}`, nil,
			400, httpapi.CodeUnknownField, []string{`"INPUT"`, "input, metadata", `send "input"`}},
		{"Metadata", submit, `{"input": "answer:x", "Metadata": {}}`, nil, 400, httpapi.CodeUnknownField, []string{`"Metadata"`}},
		{"Message", input, `{"Message": "x"}`, nil, 400, httpapi.CodeUnknownField, []string{`"Message"`, "approvals, message"}},
		{"Tool_Call_ID", input, `{"approvals": [{"Tool_Call_ID": "call_1_1", "approved": true}]}`, nil,
			400, httpapi.CodeUnknownField, []string{`"Tool_Call_ID"`, `"approvals[0]"`, "tool_call_id, approved, reason"}},
		{"Reason on cancel", "/v1/runs/" + waiting.ID + "/cancel", `{"Reason": "x"}`, nil, 400, httpapi.CodeUnknownField, []string{`"Reason"`}},
		{"text/plain", submit, `{"input": "answer:x"}`, []string{"Content-Type", "text/plain"},
			415, httpapi.CodeMediaType, []string{"text/plain", "Content-Type: application/json"}},
		{"curl's default", submit, `{"input": "answer:x"}`, []string{"Content-Type", "application/x-www-form-urlencoded"},
			415, httpapi.CodeMediaType, []string{"curl", "-H 'Content-Type: application/json'"}},
		{"JSON in latin1", submit, `{"input": "answer:x"}`, []string{"Content-Type", "application/json; charset=iso-8859-1"},
			415, httpapi.CodeMediaType, []string{"UTF-8"}},
		{"text/plain on input", input, `{"message": "x"}`, []string{"Content-Type", "text/plain"}, 415, httpapi.CodeMediaType, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := e.do("POST", c.path, tokenAcme, c.body, c.header...)
			require.Equal(t, c.status, r.Status, "body: %s", r.Body)
			require.Equal(t, c.code, r.errCode(t))
			for _, s := range c.says {
				require.Contains(t, r.message(t), s)
			}
			require.True(t, utf8.Valid(r.Body) && json.Valid(r.Body), "the error body is JSON: %q", r.Body)
		})
	}
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/sessions/s1/runs", tokenAcme, "").Status, "no Run was created")
	after := e.get(tokenAcme, waiting.ID)
	require.Equal(t, loop.StatusWaiting, after.Status, "nothing reached the waiting Run")
	require.Len(t, after.Waiting.Approvals, 1)

	// What is taken: JSON declared with or without charset=utf-8, in any
	// case, or not declared; metadata 64 levels deep; characters escaped
	// as surrogate pairs.
	for i, h := range [][]string{
		nil,
		{"Content-Type", "application/json"},
		{"Content-Type", "application/json; charset=utf-8"},
		{"Content-Type", "Application/JSON; Charset=UTF-8"},
	} {
		body := fmt.Sprintf(`{"input": "answer:x", "metadata": {"n": %d, "deep": %s, "emoji": "\ud83d\ude00 ü"}}`, i, nested(63))
		r := e.do("POST", submit, tokenAcme, body, h...)
		require.Equal(t, http.StatusCreated, r.Status, "header %v: %s", h, r.Body)
		got := e.do("GET", "/v1/runs/"+r.run(t).ID, tokenAcme, "")
		require.True(t, json.Valid(got.Body))
		var md struct{ Emoji string }
		require.NoError(t, json.Unmarshal(got.run(t).Metadata, &md))
		require.Equal(t, "😀 ü", md.Emoji)
	}
}

// A Run stored before the API refused invalid UTF-8 still reads as JSON:
// the bytes that are not UTF-8 read as U+FFFD, as encoding/json renders
// them in strings.
func TestARunWithInvalidUTF8MetadataReadsAsJSON(t *testing.T) {
	e := newEnv(t)
	id := e.storeRun(t, "legacy", "run_legacy", "answer:x", json.RawMessage("{\"k\":\"a\xffb\"}"))
	r := e.do("GET", "/v1/runs/"+id, tokenAcme, "")
	require.Equal(t, http.StatusOK, r.Status)
	require.True(t, utf8.Valid(r.Body) && json.Valid(r.Body), "JSON is UTF-8 (RFC 8259): %q", r.Body)
	require.JSONEq(t, `{"k": "a\ufffdb"}`, string(r.run(t).Metadata))

	// Its event stream too: the run_created event carries the metadata.
	ev, ok := e.stream(tokenAcme, id).next()
	require.True(t, ok, "the stream sent no event")
	require.Equal(t, "run_created", ev.Event)
	require.True(t, utf8.ValidString(ev.Data) && json.Valid([]byte(ev.Data)), "an event's data is UTF-8 JSON: %q", ev.Data)
	require.Contains(t, ev.Data, "a\ufffdb")
}

// nested returns a JSON value n levels deep: objects and arrays,
// alternating.
func nested(n int) string {
	s := "1"
	for i := n - 1; i >= 0; i-- {
		if i%2 == 0 {
			s = `{"a":` + s + `}`
		} else {
			s = `[` + s + `]`
		}
	}
	return s
}

// Every response carries an X-Request-ID (the client's when it is a sane
// token), every error body as error.request_id, and the server's log
// line of the request carries it too, with the error behind a failure
// that the tenant sees only as a code and a message.
func TestRequestIDsTieAnswersToTheLog(t *testing.T) {
	const secret = "dial tcp 10.0.0.7:5432: connect: connection refused"
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) {
		c.Store = failingSessionRuns{Store: c.Store, err: errors.New(secret)}
	})
	ids := map[string]bool{}
	for _, c := range []struct{ method, path, token string }{
		{"GET", "/healthz", ""},
		{"GET", "/v1/runs/run_nosuchrun", tokenAcme},
		{"GET", "/v1/runs/run_nosuchrun", ""},
		{"GET", "/v2/nothing", tokenAcme},
		{"GET", "/v1/sessions/s1/runs", tokenAcme}, // the store fails: 500
	} {
		r := e.do(c.method, c.path, c.token, "")
		id := r.Header.Get(httpapi.RequestIDHeader)
		require.NotEmpty(t, id, "%s %s answers with an X-Request-ID", c.method, c.path)
		require.False(t, ids[id], "request IDs are unique")
		ids[id] = true
		if r.Status >= 400 {
			var b struct {
				Error struct {
					RequestID string `json:"request_id"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(r.Body, &b))
			require.Equal(t, id, b.Error.RequestID, "the error body carries the request ID")
		}
		line := logLineOf(t, e, id)
		require.Equal(t, c.path, line["path"])
		require.Equal(t, float64(r.Status), line["status"])
		if r.Status == http.StatusInternalServerError {
			require.Equal(t, httpapi.CodeInternal, r.errCode(t))
			require.NotContains(t, string(r.Body), "10.0.0.7", "the tenant does not see the internal error")
			require.Contains(t, line["error"], secret, "the log line has the detail")
		}
	}

	// A client's own ID, when it is a sane token, names the request.
	for _, own := range []string{"0b1e7f0c-4a0e-4c1e-9d4e-2f7a3b8c9d10", "trace:abc.DEF_1-2"} {
		r := e.do("GET", "/v1/runs/run_nosuchrun", tokenAcme, "", httpapi.RequestIDHeader, own)
		require.Equal(t, own, r.Header.Get(httpapi.RequestIDHeader))
		require.Equal(t, float64(http.StatusNotFound), logLineOf(t, e, own)["status"])
	}
	// Anything else is replaced.
	for _, bad := range []string{"has space", `quote"d`, strings.Repeat("a", 129), "ünï"} {
		r := e.do("GET", "/healthz", "", "", httpapi.RequestIDHeader, bad)
		got := r.Header.Get(httpapi.RequestIDHeader)
		require.NotEmpty(t, got)
		require.NotEqual(t, bad, got)
		require.NotContains(t, e.logs.String(), bad)
	}
}

// failingSessionRuns is a store whose session listings fail.
type failingSessionRuns struct {
	httpapi.Store
	err error
}

func (f failingSessionRuns) SessionRuns(context.Context, string, string, int64, int) ([]runtime.SessionRun, error) {
	return nil, f.err
}

// logLineOf returns the "http request" log line with the request ID.
func logLineOf(t *testing.T, e *env, id string) map[string]any {
	t.Helper()
	var found map[string]any
	waitFor(t, "the log line of request "+id, func() bool {
		for _, line := range strings.Split(strings.TrimSpace(e.logs.String()), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "http request" && rec["request_id"] == id {
				found = rec
				return true
			}
		}
		return false
	})
	return found
}

// A refusal names the tenant's own Run and what to do, never the
// runtime's or the loop's text, which stays in the log.
func TestRefusalsShowNoInternals(t *testing.T) {
	e := newEnv(t)
	run := e.submit(tokenAcme, "s1", `call:wire({"text":"w"})|answer:$results`)
	e.waitRun(tokenAcme, run.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 1
	})
	r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_9_9", "approved": true}]}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeUnknownToolCall, r.errCode(t))
	require.Contains(t, r.message(t), `tool call "call_9_9" is not a tool call of the Run's current step`)
	noInternals(t, r)
	require.Contains(t, logLineOf(t, e, r.Header.Get(httpapi.RequestIDHeader))["error"], "loop: unknown tool call")

	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"message": "hello"}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeNotAwaiting, r.errCode(t))
	noInternals(t, r)

	require.Equal(t, http.StatusAccepted, e.do("POST", "/v1/runs/"+run.ID+"/cancel", tokenAcme, "").Status)
	e.waitStatus(tokenAcme, run.ID, loop.StatusCancelled)
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, `{"approvals": [{"tool_call_id": "call_1_1", "approved": true}]}`)
	require.Equal(t, http.StatusConflict, r.Status)
	require.Equal(t, httpapi.CodeRunTerminal, r.errCode(t))
	require.Contains(t, r.message(t), run.ID)
	noInternals(t, r)
}

func noInternals(t *testing.T, r reply) {
	t.Helper()
	for _, internal := range []string{"loop:", "runtime:", "host:", "plugin[", "_recorded", "refused"} {
		require.NotContains(t, r.message(t), internal)
	}
}

// A page of a session's Runs is bounded in bytes as well as in count, and
// carries a summary of each Run, not its input or metadata: 200 Runs of 1
// MB inputs page in a few kilobytes, and paging on with next_after gives
// every Run once, in order.
//
// The Runs are written to the store directly, as submissions the runtime
// has not started on: driven, each would have its builder read the whole
// session, every Run whole, from the MemStore. Under the race detector
// the inputs are 50 kB: the page of the 200 Runs whole would still be 10
// times the bound.
func TestSessionRunsPagesAreBoundedSummaries(t *testing.T) {
	e := newEnv(t)
	size := 1_000_000
	if raceEnabled {
		size = 50_000
	}
	big := strings.Repeat("x", size)
	var want []string
	for i := 0; i < 200; i++ {
		metadata, _ := json.Marshal(map[string]string{"pad": big[:10_000]})
		want = append(want, e.storeRun(t, "big", fmt.Sprintf("run_big_%03d", i), fmt.Sprintf("bogus:%03d:%s", i, big), metadata))
	}

	r := e.do("GET", "/v1/sessions/big/runs?limit=200", tokenAcme, "")
	require.Equal(t, http.StatusOK, r.Status)
	require.LessOrEqual(t, len(r.Body), httpapi.DefaultMaxPageBytes, "the page is bounded in bytes")
	var raw struct {
		Runs []map[string]json.RawMessage `json:"runs"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &raw))
	require.NotEmpty(t, raw.Runs)
	for _, item := range raw.Runs {
		for _, gone := range []string{"input", "metadata", "result", "failure", "waiting"} {
			require.NotContains(t, item, gone, "a list item has no %q", gone)
		}
		for _, kept := range []string{"ordinal", "id", "session", "status", "input_preview", "usage", "created_at", "updated_at", "step", "seq"} {
			require.Contains(t, item, kept)
		}
	}

	for _, limit := range []int{120} {
		var got []string
		after := int64(0)
		for pages := 0; ; pages++ {
			require.Less(t, pages, 201, "paging ends")
			r := e.do("GET", "/v1/sessions/big/runs?limit="+strconv.Itoa(limit)+"&after="+strconv.FormatInt(after, 10), tokenAcme, "")
			require.Equal(t, http.StatusOK, r.Status, "body: %.300s", r.Body)
			require.LessOrEqual(t, len(r.Body), httpapi.DefaultMaxPageBytes)
			var page httpapi.RunListJSON
			require.NoError(t, json.Unmarshal(r.Body, &page))
			require.LessOrEqual(t, len(page.Runs), limit)
			for _, s := range page.Runs {
				got = append(got, s.ID)
				require.Equal(t, int64(len(got)), s.Ordinal)
				require.Equal(t, fmt.Sprintf("bogus:%03d:", s.Ordinal-1)+big[:httpapi.InputPreviewChars-10], s.InputPreview)
			}
			if page.NextAfter == nil {
				break
			}
			require.Equal(t, page.Runs[len(page.Runs)-1].Ordinal, *page.NextAfter)
			after = *page.NextAfter
		}
		require.Equal(t, want, got, "limit %d: every Run once, in order", limit)
	}
}

// storeRun writes a pending Run of acme to the store, as a submission
// does, without handing it to the runtime.
func (e *env) storeRun(t *testing.T, session, id, input string, metadata json.RawMessage) string {
	t.Helper()
	now := e.clock.Now().UnixMilli()
	ev := loop.RunCreated(loop.Spec{Tenant: "acme", Session: session, ID: id, Input: input, Metadata: metadata,
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}, now)
	ev.Seq = 1
	run, err := loop.Apply(loop.Run{}, ev)
	require.NoError(t, err)
	_, err = e.store.CreateRun(t.Context(), runtime.CreateRun{Run: run, Event: ev})
	require.NoError(t, err)
	return id
}

// Config.MaxPageBytes bounds the pages of the API: a page cut by it ends
// with next_after, and paging on gives every Run once.
func TestMaxPageBytesCutsThePages(t *testing.T) {
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) { c.MaxPageBytes = 2048 })
	var want []string
	for i := 0; i < 40; i++ {
		want = append(want, e.storeRun(t, "s1", fmt.Sprintf("run_page_%02d", i), strings.Repeat("y", 1000), nil))
	}
	var got []string
	after, pages := int64(0), 0
	for ; ; pages++ {
		require.Less(t, pages, 40, "paging ends")
		r := e.do("GET", fmt.Sprintf("/v1/sessions/s1/runs?limit=500&after=%d", after), tokenAcme, "")
		require.Equal(t, http.StatusOK, r.Status)
		require.LessOrEqual(t, len(r.Body), 2048)
		var page httpapi.RunListJSON
		require.NoError(t, json.Unmarshal(r.Body, &page))
		for _, s := range page.Runs {
			got = append(got, s.ID)
		}
		if page.NextAfter == nil {
			break
		}
		after = *page.NextAfter
	}
	require.Greater(t, pages, 4, "the bytes cut the pages")
	require.Equal(t, want, got)
}

// A summary says where a Run stands: what it waits for, in numbers, and
// the class of its failure.
func TestRunSummaries(t *testing.T) {
	e := newEnv(t)
	waiting := e.submit(tokenAcme, "s1", `call:wire({"text":"w1"}),wire({"text":"w2"})|answer:$results`)
	e.waitRun(tokenAcme, waiting.ID, "to wait for two approvals", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 2
	})
	queued := e.submit(tokenAcme, "s1", "answer:later")
	failed := e.submit(tokenAcme, "s2", "bogus:x")
	e.waitStatus(tokenAcme, failed.ID, loop.StatusFailed)

	page := listAll(t, e, tokenAcme, "s1", 50)
	require.Len(t, page, 2)
	require.Equal(t, waiting.ID, page[0].ID)
	require.Equal(t, &httpapi.WaitingSummaryJSON{Approvals: 2}, page[0].WaitingSummary)
	require.Equal(t, queued.ID, page[1].ID)
	require.Equal(t, &httpapi.WaitingSummaryJSON{Queued: true}, page[1].WaitingSummary)
	require.Empty(t, page[0].FailureClass)

	s2 := listAll(t, e, tokenAcme, "s2", 50)
	require.Len(t, s2, 1)
	full := e.get(tokenAcme, failed.ID)
	require.Equal(t, full.Failure.Class, s2[0].FailureClass)
	require.Nil(t, s2[0].WaitingSummary)
	require.Equal(t, full.Usage, s2[0].Usage)
	require.Equal(t, full.Seq, s2[0].Seq)
	require.Equal(t, full.UpdatedAt, s2[0].UpdatedAt)
}

// listAll pages through a session's Runs.
func listAll(t *testing.T, e *env, token, session string, limit int) []httpapi.RunSummaryJSON {
	t.Helper()
	var out []httpapi.RunSummaryJSON
	after := int64(0)
	for {
		r := e.do("GET", fmt.Sprintf("/v1/sessions/%s/runs?limit=%d&after=%d", session, limit, after), token, "")
		require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)
		var page httpapi.RunListJSON
		require.NoError(t, json.Unmarshal(r.Body, &page))
		out = append(out, page.Runs...)
		if page.NextAfter == nil {
			return out
		}
		after = *page.NextAfter
	}
}
