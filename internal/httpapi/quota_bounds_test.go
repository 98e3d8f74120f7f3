package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// withFields sets the server's field limits.
func withFields(f httpapi.FieldLimits) envOption {
	return func(c *httpapi.Config, _ *runtime.Options) { c.Fields = f }
}

// held is what the tenant's Runs hold in the store, read from it now.
func (e *env) held(tenant string) int64 {
	e.t.Helper()
	n, err := e.store.TenantStoredBytes(context.Background(), tenant)
	require.NoError(e.t, err)
	return n
}

// waitingForApproval submits n Runs, each in a session of its own, whose
// first step asks for a wire transfer, and waits until each waits for its
// approval. The model answers "denied" next, whatever the tool returned.
func (e *env) waitingForApproval(n int) []string {
	e.t.Helper()
	var ids []string
	for i := range n {
		run := e.submit(tokenAcme, "gate"+strconv.Itoa(i), `call:wire({"text":"w"})|answer:denied`)
		e.waitRun(tokenAcme, run.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
			return r.Waiting != nil && len(r.Waiting.Approvals) == 1
		})
		ids = append(ids, run.ID)
	}
	return ids
}

func denial(reason string) string {
	b, _ := json.Marshal(map[string]any{"approvals": []any{map[string]any{"tool_call_id": "call_1_1", "approved": false, "reason": reason}}})
	return string(b)
}

// TestApprovalReasonsCannotPassTheStorageQuota is the red team's finding:
// a tenant with a 3,000,000-byte quota denied 12 waiting tool calls with
// a 1 MB reason each, was answered 200 every time, and then held 108 MB.
// Now a reason is bounded (4 KiB by default): the 1 MB ones are refused
// with 413 field_too_large, naming the field, its size and the limit, and
// nothing is written. Where the operator lets reasons be that long, each
// denial is weighed against the quota before it is accepted: those that
// would not fit answer 429 quota_stored_bytes, and once the Runs the
// accepted ones let go on have ended, the tenant holds no more than its
// quota.
func TestApprovalReasonsCannotPassTheStorageQuota(t *testing.T) {
	const quota = 3_000_000
	reason := strings.Repeat("r", 1_000_000)

	e := newEnv(t, withQuota("acme", httpapi.Quota{MaxStoredBytes: quota}), withLedgerClock())
	ids := e.waitingForApproval(12)
	before := e.held("acme")
	for _, id := range ids {
		r := e.do("POST", "/v1/runs/"+id+"/input", tokenAcme, denial(reason))
		require.Equal(t, http.StatusRequestEntityTooLarge, r.Status, "body: %.300s", r.Body)
		require.Equal(t, httpapi.CodeFieldTooLarge, r.errCode(t))
		msg := r.message(t)
		require.Contains(t, msg, `"approvals[0].reason" is 1000000 bytes`)
		require.Contains(t, msg, "limit of 4096 bytes")
		require.Contains(t, msg, "http.max_reason_bytes")
		require.Equal(t, loop.StatusWaiting, e.get(tokenAcme, id).Status, "a refused denial moved the Run on")
	}
	require.Equal(t, before, e.held("acme"), "a refused denial stored something")

	// The operator allows reasons of 1 MiB: the quota bounds them. Each
	// 200 kB denial may store up to InputStoredBytes; the ledger's clock
	// stands still, so the figure is read once, and only the reservations
	// keep the denials from all passing.
	e = newEnv(t, withQuota("acme", httpapi.Quota{MaxStoredBytes: quota}), withLedgerClock(),
		withFields(httpapi.FieldLimits{MaxReasonBytes: 1 << 20}))
	ids = e.waitingForApproval(12)
	reason = strings.Repeat("r", 200_000)
	bound := httpapi.InputStoredBytes(httpapi.InputRequest{Approvals: []httpapi.ApprovalRequest{{ToolCallID: "call_1_1", Reason: reason}}})
	var accepted []string
	for _, id := range ids {
		r := e.do("POST", "/v1/runs/"+id+"/input", tokenAcme, denial(reason))
		if r.Status == http.StatusOK {
			accepted = append(accepted, id)
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, r.Status, "body: %.300s", r.Body)
		require.Equal(t, httpapi.CodeQuotaStoredBytes, r.errCode(t))
		require.NotEmpty(t, r.Header.Get("Retry-After"))
		msg := r.message(t)
		require.Contains(t, msg, "this approval request would add up to "+strconv.FormatInt(bound, 10))
		require.Contains(t, msg, "its quota is 3000000 bytes")
		require.Contains(t, msg, "POST /v1/runs/{id}/cancel")
		require.Equal(t, loop.StatusWaiting, e.get(tokenAcme, id).Status, "a refused denial moved the Run on")
	}
	require.NotEmpty(t, accepted, "a denial that fits the quota is accepted")
	require.Less(t, len(accepted), len(ids), "every denial was accepted")
	require.LessOrEqual(t, int64(len(accepted))*bound, int64(quota), "the accepted denials' bounds pass the quota together")
	for _, id := range accepted {
		e.waitStatus(tokenAcme, id, loop.StatusCompleted)
	}
	require.LessOrEqual(t, e.held("acme"), int64(quota), "the tenant holds more than its quota")

	// A Run waiting on a refused denial can still be cancelled: the
	// storage quota never refuses a cancellation.
	waiting := ids[len(ids)-1]
	r := e.do("POST", "/v1/runs/"+waiting+"/cancel", tokenAcme, `{"reason": "over quota"}`)
	require.Equal(t, http.StatusAccepted, r.Status, "body: %s", r.Body)
}

// TestAnswersCannotPassTheStorageQuota: an answer to a Run's question is
// weighed against the quota as a denial is.
func TestAnswersCannotPassTheStorageQuota(t *testing.T) {
	const quota = 1_000_000
	e := newEnv(t, withQuota("acme", httpapi.Quota{MaxStoredBytes: quota}), withLedgerClock())
	var ids []string
	for i := range 4 {
		run := e.submit(tokenAcme, "ask"+strconv.Itoa(i), "ask:which one?|answer:ok")
		e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
		ids = append(ids, run.ID)
	}
	message := strings.Repeat("a", 200_000)
	body, _ := json.Marshal(map[string]string{"message": message})
	bound := httpapi.InputStoredBytes(httpapi.InputRequest{Message: &message})
	var accepted []string
	for _, id := range ids {
		r := e.do("POST", "/v1/runs/"+id+"/input", tokenAcme, string(body))
		if r.Status == http.StatusOK {
			accepted = append(accepted, id)
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, r.Status, "body: %.300s", r.Body)
		require.Equal(t, httpapi.CodeQuotaStoredBytes, r.errCode(t))
		require.Contains(t, r.message(t), "this answer would add up to "+strconv.FormatInt(bound, 10))
		require.Equal(t, loop.StatusWaiting, e.get(tokenAcme, id).Status, "a refused answer moved the Run on")
	}
	require.NotEmpty(t, accepted)
	require.Less(t, len(accepted), len(ids), "every answer was accepted")
	for _, id := range accepted {
		e.waitStatus(tokenAcme, id, loop.StatusCompleted)
	}
	require.LessOrEqual(t, e.held("acme"), int64(quota), "the tenant holds more than its quota")

	// An answer that could not fit even an empty quota is 413, not to be
	// retried.
	huge := strings.Repeat("a", 300_000)
	body, _ = json.Marshal(map[string]string{"message": huge})
	r := e.do("POST", "/v1/runs/"+ids[len(ids)-1]+"/input", tokenAcme, string(body))
	require.Equal(t, http.StatusRequestEntityTooLarge, r.Status, "body: %.300s", r.Body)
	require.Equal(t, httpapi.CodeQuotaStoredBytes, r.errCode(t))
	require.Contains(t, r.message(t), "message is 300000 bytes")
	require.Contains(t, r.message(t), "could never be stored")
	require.Empty(t, r.Header.Get("Retry-After"))
}

// TestABurstOfSubmissionsCannotOvershootTheStorageQuota is the red
// team's second finding: 10 parallel submissions of ~50 kB against a
// 400,000-byte quota all got 201, and the tenant then held 1,949,720
// bytes. Each submission now reserves the most it stores up to its first
// model step (SubmissionStoredBytes) before it is accepted, so the burst
// cannot pass the quota together, though the figure read from the store
// (once, the ledger's clock standing still) shows none of them.
func TestABurstOfSubmissionsCannotOvershootTheStorageQuota(t *testing.T) {
	const quota = 400_000
	e := newEnv(t, withQuota("acme", httpapi.Quota{MaxStoredBytes: quota}), withLedgerClock())
	// The script answers "ok" and never reaches the padding: a Run holds
	// its input as the submission left it, with no answer echoing it.
	input := "answer:ok|" + strings.Repeat("p", 48_000-len("answer:ok|"))
	body, _ := json.Marshal(map[string]string{"input": input})
	bound := httpapi.SubmissionStoredBytes(httpapi.SubmitRequest{Input: input}, "")

	const burst = 10
	replies := make([]reply, burst)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest("POST", e.ts.URL+"/v1/sessions/burst"+strconv.Itoa(i)+"/runs", strings.NewReader(string(body)))
			req.Header.Set("Authorization", "Bearer "+tokenAcme)
			resp, err := e.ts.Client().Do(req)
			if err != nil {
				replies[i] = reply{Status: -1, Body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				replies[i] = reply{Status: -1, Body: []byte(err.Error())}
				return
			}
			replies[i] = reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
		}()
	}
	close(start)
	wg.Wait()

	var accepted []string
	for _, r := range replies {
		if r.Status == http.StatusCreated {
			accepted = append(accepted, r.run(t).ID)
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, r.Status, "body: %.300s", r.Body)
		require.Equal(t, httpapi.CodeQuotaStoredBytes, r.errCode(t))
		require.NotEmpty(t, r.Header.Get("Retry-After"))
		require.Contains(t, r.message(t), "this submission would add up to "+strconv.FormatInt(bound, 10))
	}
	require.NotEmpty(t, accepted, "no submission of the burst was accepted")
	require.LessOrEqual(t, int64(len(accepted))*bound, int64(quota),
		"%d submissions accepted, each of up to %d bytes, against a quota of %d", len(accepted), bound, quota)
	for _, id := range accepted {
		e.waitStatus(tokenAcme, id, loop.StatusCompleted)
	}
	held := e.held("acme")
	require.LessOrEqual(t, held, int64(quota), "the tenant holds %d bytes after the burst; its quota is %d", held, quota)
	t.Logf("%d of %d submissions of %d bytes accepted (each reserving %d bytes); the tenant holds %d bytes of its %d", len(accepted), burst, len(input), bound, held, quota)
}

// TestTenantSuppliedStringsAreBounded sends each string a tenant can have
// stored, one byte over its limit and at its limit: over it, 413
// field_too_large naming the field, its size, the limit and its key, with
// nothing written and the refusal counted in the metrics; at it, accepted.
func TestTenantSuppliedStringsAreBounded(t *testing.T) {
	f := httpapi.FieldLimits{MaxInputBytes: 1000, MaxMetadataBytes: 500, MaxReasonBytes: 100}
	var seen limitsSeen
	e := newEnv(t, withFields(f), seen.option(nil))
	asks := func(session string) httpapi.RunJSON {
		run := e.submit(tokenAcme, session, "ask:which one?|answer:ok")
		return e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
	}
	str := func(n int) string { return strings.Repeat("s", n) }
	input := func(n int) string { return "answer:ok|" + str(n-len("answer:ok|")) }
	// metadata of exactly n bytes, as sent.
	metadata := func(n int) string { return `{"k":"` + str(n-len(`{"k":""}`)) + `"}` }
	body := func(v map[string]any) string { b, _ := json.Marshal(v); return string(b) }

	refused := func(r reply, field string, size, limit int, key string) {
		t.Helper()
		require.Equal(t, http.StatusRequestEntityTooLarge, r.Status, "body: %.300s", r.Body)
		require.Equal(t, httpapi.CodeFieldTooLarge, r.errCode(t))
		msg := r.message(t)
		require.Contains(t, msg, strconv.Quote(field)+" is "+strconv.Itoa(size)+" bytes")
		require.Contains(t, msg, "limit of "+strconv.Itoa(limit)+" bytes")
		require.Contains(t, msg, "(http."+key+")")
	}

	// A submission's input and metadata.
	r := e.do("POST", "/v1/sessions/in/runs", tokenAcme, body(map[string]any{"input": input(1001)}))
	refused(r, "input", 1001, 1000, httpapi.LimitInputBytes)
	r = e.do("POST", "/v1/sessions/in/runs", tokenAcme, `{"input": "answer:ok", "metadata": `+metadata(501)+`}`)
	refused(r, "metadata", 501, 500, httpapi.LimitMetadataBytes)
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/sessions/in/runs", tokenAcme, "").Status, "a refused submission created a Run")
	e.submit(tokenAcme, "in", input(1000))
	r = e.do("POST", "/v1/sessions/in/runs", tokenAcme, `{"input": "answer:ok", "metadata": `+metadata(500)+`}`)
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)

	// An answer is bounded like an input.
	waiting := asks("answer")
	r = e.do("POST", "/v1/runs/"+waiting.ID+"/input", tokenAcme, body(map[string]any{"message": str(1001)}))
	refused(r, "message", 1001, 1000, httpapi.LimitInputBytes)
	require.Equal(t, waiting.Seq, e.get(tokenAcme, waiting.ID).Seq, "a refused answer was written")
	r = e.do("POST", "/v1/runs/"+waiting.ID+"/input", tokenAcme, body(map[string]any{"message": str(1000)}))
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	// Each approval's reason, named by its place in the request.
	run := e.submit(tokenAcme, "deny", `call:wire({"text":"a"}),wire({"text":"b"})|answer:ok`)
	gated := e.waitRun(tokenAcme, run.ID, "to wait for two approvals", func(r httpapi.RunJSON) bool {
		return r.Waiting != nil && len(r.Waiting.Approvals) == 2
	})
	decisions := func(second int) string {
		return body(map[string]any{"approvals": []any{
			map[string]any{"tool_call_id": "call_1_1", "approved": false, "reason": str(10)},
			map[string]any{"tool_call_id": "call_1_2", "approved": false, "reason": str(second)},
		}})
	}
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, decisions(101))
	refused(r, "approvals[1].reason", 101, 100, httpapi.LimitReasonBytes)
	require.Equal(t, gated.Seq, e.get(tokenAcme, run.ID).Seq, "a refused approval request was written")
	r = e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, decisions(100))
	require.Equal(t, http.StatusOK, r.Status, "body: %s", r.Body)

	// A cancellation's reason.
	waiting = asks("cancel")
	r = e.do("POST", "/v1/runs/"+waiting.ID+"/cancel", tokenAcme, body(map[string]any{"reason": str(101)}))
	refused(r, "reason", 101, 100, httpapi.LimitReasonBytes)
	require.Equal(t, waiting.Seq, e.get(tokenAcme, waiting.ID).Seq, "a refused cancellation was written")
	r = e.do("POST", "/v1/runs/"+waiting.ID+"/cancel", tokenAcme, body(map[string]any{"reason": str(100)}))
	require.Equal(t, http.StatusAccepted, r.Status, "body: %s", r.Body)

	require.Equal(t, []string{
		httpapi.LimitInputBytes + "/acme", httpapi.LimitMetadataBytes + "/acme", httpapi.LimitInputBytes + "/acme",
		httpapi.LimitReasonBytes + "/acme", httpapi.LimitReasonBytes + "/acme",
	}, seen.all(), "the refusals OnLimit heard")

	// The defaults bound a server that sets none.
	d := newEnv(t)
	r = d.do("POST", "/v1/sessions/in/runs", tokenAcme, body(map[string]any{"input": input(httpapi.DefaultMaxInputBytes + 1)}))
	refused(r, "input", httpapi.DefaultMaxInputBytes+1, httpapi.DefaultMaxInputBytes, httpapi.LimitInputBytes)
	r = d.do("POST", "/v1/sessions/in/runs", tokenAcme, `{"input": "answer:ok", "metadata": `+metadata(httpapi.DefaultMaxMetadataBytes+1)+`}`)
	refused(r, "metadata", httpapi.DefaultMaxMetadataBytes+1, httpapi.DefaultMaxMetadataBytes, httpapi.LimitMetadataBytes)
	waiting = d.submit(tokenAcme, "cancel", "ask:which one?|answer:ok")
	d.waitStatus(tokenAcme, waiting.ID, loop.StatusWaiting)
	r = d.do("POST", "/v1/runs/"+waiting.ID+"/cancel", tokenAcme, body(map[string]any{"reason": str(httpapi.DefaultMaxReasonBytes + 1)}))
	refused(r, "reason", httpapi.DefaultMaxReasonBytes+1, httpapi.DefaultMaxReasonBytes, httpapi.LimitReasonBytes)

	auth, err := httpapi.NewTokenAuthenticator(map[string][]string{"acme": {httpapi.HashToken(tokenAcme)}})
	require.NoError(t, err)
	_, err = httpapi.New(httpapi.Config{Runtime: e.rt, Store: e.store, Auth: auth, Fields: httpapi.FieldLimits{MaxReasonBytes: -1}})
	require.ErrorContains(t, err, "field limits must be 0 (the default) or positive")
}
