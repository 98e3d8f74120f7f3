package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/runcodec"
	"github.com/agenthost/agenthost/loop"
)

// copiesOf says where the store keeps marker for one Run: how many times
// its snapshot (in the stores' binary form) holds it, in which fields, and
// how many times each event of its log does, with the sizes the stores
// count (TenantStoredBytes).
func (e *env) copiesOf(tenant, runID, marker string) string {
	e.t.Helper()
	ctx := context.Background()
	run, err := e.store.LoadRun(ctx, tenant, runID)
	require.NoError(e.t, err)
	// In JSON the marker may be escaped.
	quoted, err := json.Marshal(marker)
	require.NoError(e.t, err)
	escaped := string(quoted[1 : len(quoted)-1])
	copies := func(s string) int {
		if escaped == marker {
			return strings.Count(s, marker)
		}
		return strings.Count(s, marker) + strings.Count(s, escaped)
	}
	count := func(v any) int {
		b, err := json.Marshal(v)
		require.NoError(e.t, err)
		return copies(string(b))
	}
	snap := runcodec.Append(nil, &run)
	var b strings.Builder
	fmt.Fprintf(&b, "  snapshot: %d bytes, %d copies (spec %d, transcript %d, effects %d, verdict %d, result %d, failure %d)\n",
		len(snap), strings.Count(string(snap), marker), count(run.Spec), count(run.Transcript), count(run.Effects),
		count(run.Verdict), strings.Count(run.Result, marker), count(run.Failure))
	evs, err := e.store.Events(ctx, tenant, runID, 1, 0)
	require.NoError(e.t, err)
	for _, ev := range evs {
		raw, err := runcodec.MarshalJSON(ev)
		require.NoError(e.t, err)
		if n := copies(string(raw)); n > 0 {
			fmt.Fprintf(&b, "  event %d %s: %d bytes, %d copies\n", ev.Seq, ev.Type, len(raw), n)
		}
	}
	return b.String()
}

// A write whose stored bytes are weighed: what the tenant sends, the
// Run it is sent to (made by prepare, in session), and the most the
// storage quota reckons it stores.
type weighedWrite struct {
	name  string
	run   func(e *env, session, payload string) string // returns the Run's ID, ended
	bound func(payload string) int64
}

var weighedWrites = []weighedWrite{
	{
		name: "a submission's input",
		run: func(e *env, session, payload string) string {
			run := e.submit(tokenAcme, session, "answer:ok|"+payload)
			e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
			return run.ID
		},
		bound: func(payload string) int64 {
			return httpapi.SubmissionStoredBytes(httpapi.SubmitRequest{Input: "answer:ok|" + payload}, "")
		},
	},
	{
		name: "an answer",
		run: func(e *env, session, payload string) string {
			run := e.submit(tokenAcme, session, "ask:which one?|answer:ok")
			e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
			body, _ := json.Marshal(map[string]string{"message": payload})
			r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, string(body))
			require.Equal(e.t, http.StatusOK, r.Status, "body: %.300s", r.Body)
			e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
			return run.ID
		},
		bound: func(payload string) int64 { return httpapi.InputStoredBytes(httpapi.InputRequest{Message: &payload}) },
	},
	{
		name: "a denial's reason",
		run: func(e *env, session, payload string) string {
			run := e.submit(tokenAcme, session, `call:wire({"text":"w"})|answer:ok`)
			e.waitRun(tokenAcme, run.ID, "to wait for an approval", func(r httpapi.RunJSON) bool {
				return r.Waiting != nil && len(r.Waiting.Approvals) == 1
			})
			r := e.do("POST", "/v1/runs/"+run.ID+"/input", tokenAcme, denial(payload))
			require.Equal(e.t, http.StatusOK, r.Status, "body: %.300s", r.Body)
			e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
			return run.ID
		},
		bound: func(payload string) int64 {
			return httpapi.InputStoredBytes(httpapi.InputRequest{Approvals: []httpapi.ApprovalRequest{{ToolCallID: "call_1_1", Reason: payload}}})
		},
	},
	{
		// Not weighed against the quota (it is never refused by it), but
		// bounded by the same reckoning.
		name: "a cancellation's reason",
		run: func(e *env, session, payload string) string {
			run := e.submit(tokenAcme, session, "ask:which one?|answer:ok")
			e.waitStatus(tokenAcme, run.ID, loop.StatusWaiting)
			body, _ := json.Marshal(map[string]string{"reason": payload})
			r := e.do("POST", "/v1/runs/"+run.ID+"/cancel", tokenAcme, string(body))
			require.Equal(e.t, http.StatusAccepted, r.Status, "body: %.300s", r.Body)
			e.waitStatus(tokenAcme, run.ID, loop.StatusCancelled)
			return run.ID
		},
		bound: func(payload string) int64 { return 1<<10 + httpapi.StoredBytesBound(payload) },
	},
}

// TestTheStorageEstimateBoundsWhatEachWriteStores measures what the store
// keeps for each byte a tenant sends, in plain text and in text JSON
// escapes (every byte one of < > &, which encoding/json writes as six):
// the same Run made with a 20 kB string and with a 20-byte one, to the
// Run's end, the difference over the strings' being the cost of a byte.
// It holds the storage quota's reckoning (StoredBytesBound and the
// estimates built on it) to be an upper bound of it, and logs where each
// copy is.
func TestTheStorageEstimateBoundsWhatEachWriteStores(t *testing.T) {
	e := newEnv(t, withFields(httpapi.FieldLimits{MaxReasonBytes: 1 << 20}))
	const size = 20_000
	texts := map[string]func(n int) string{
		"plain":   func(n int) string { return strings.Repeat("0123456789abcdef", n/16+1)[:n] },
		"escaped": func(n int) string { return strings.Repeat("<&>", n/3+1)[:n] },
	}
	i := 0
	for _, w := range weighedWrites {
		for kind, text := range texts {
			small, big := text(20), text(size)
			held := func(payload string) (int64, string) {
				i++
				before := e.held("acme")
				id := w.run(e, fmt.Sprintf("weigh%d", i), payload)
				return e.held("acme") - before, id
			}
			heldSmall, _ := held(small)
			heldBig, id := held(big)
			grew, reckoned := heldBig-heldSmall, w.bound(big)-w.bound(small)
			t.Logf("%s, %s: %.2f stored bytes a byte sent (reckoned %.2f); the Run holds %d bytes in all, with %d sent (this write reckoned up to %d)\n%s",
				w.name, kind, float64(grew)/float64(size-20), float64(reckoned)/float64(size-20), heldBig, size, w.bound(big),
				e.copiesOf("acme", id, big))
			// The binary snapshot's length prefixes are varints, a byte or
			// two longer for the long string: framing, which each
			// estimate's allowance covers.
			const framing = 64
			require.LessOrEqual(t, grew, reckoned+framing, "%s, %s: a byte sent costs more than the quota reckons", w.name, kind)
		}
	}
}

// TestWhatARunStoresAfterItsSubmission logs, for docs/OPERATIONS.md,
// what the storage quota does not reckon in advance: a tool's result (in
// its settlement, in the transcript, and in every later model step's
// request), the requests of later model steps (each holds the transcript
// so far), the final answer (in the model's settlement, the transcript,
// the verdict, the result and the last event), and the session's later
// Runs (each step's request holds the earlier Runs' transcripts as
// history). It checks the two facts the docs state: a closed step's tool
// results are in the snapshot once (the transcript), and the session's
// next Run stores an earlier input again.
func TestWhatARunStoresAfterItsSubmission(t *testing.T) {
	e := newEnv(t)
	const size = 20_000
	pad := strings.Repeat("0123456789abcdef", size/16)
	cost := func(session, script string) (int64, string) {
		before := e.held("acme")
		run := e.submit(tokenAcme, session, script)
		e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
		return e.held("acme") - before, run.ID
	}

	// A tool returns a 20 kB result (the echo tool returns its "text"),
	// then the model takes 1 or 3 more steps.
	for _, steps := range []int{1, 3} {
		script := `call:echo({"text":"` + pad + `"})` + strings.Repeat(`|call:echo({"text":"x"})`, steps-1) + "|answer:ok"
		small := `call:echo({"text":"x"})` + strings.Repeat(`|call:echo({"text":"x"})`, steps-1) + "|answer:ok"
		held, id := cost(fmt.Sprintf("tool%d", steps), script)
		heldSmall, _ := cost(fmt.Sprintf("toolsmall%d", steps), small)
		t.Logf("a 20 kB tool argument and result, %d model steps after it: %.2f stored bytes a byte\n%s",
			steps, float64(held-heldSmall)/float64(size), e.copiesOf("acme", id, pad))
		run, err := e.store.LoadRun(context.Background(), "acme", id)
		require.NoError(t, err)
		require.Empty(t, run.Effects[1:], "a closed step's tool effects are gone from the snapshot: the result is in the transcript only")
	}

	// The model answers with 20 kB (the script's answer is the rest of
	// the input).
	held, id := cost("answer", "answer:"+pad)
	t.Logf("a 20 kB input the model answers with: the Run holds %d bytes\n%s", held, e.copiesOf("acme", id, pad))

	// The session's next Run holds the first's transcript in its model
	// step's request, as history. (The scripted model follows the first
	// user message it is shown, the first Run's: its second step answers
	// the second Run.)
	first, _ := cost("hist", "answer:ok|answer:ok|"+pad)
	second, id := cost("hist", "answer:ok")
	alone, _ := cost("nohist", "answer:ok")
	t.Logf("a 20 kB input costs the session's next Run %d bytes more than a Run without history (%d, %d): %.2f stored bytes a byte; the first Run held %d\n%s",
		second-alone, second, alone, float64(second-alone)/float64(size), first, e.copiesOf("acme", id, pad))
	require.Greater(t, second-alone, int64(size), "the next Run holds the earlier input again, in its request's history")
}

// fakeStoredBytes is a StoredBytesReader whose figure the test sets, and
// which can run a hook in the middle of a read.
type fakeStoredBytes struct {
	mu     sync.Mutex
	n      int64
	reads  int
	during func()
}

func (f *fakeStoredBytes) set(n int64) { f.mu.Lock(); f.n = n; f.mu.Unlock() }

func (f *fakeStoredBytes) TenantStoredBytes(context.Context, string) (int64, error) {
	f.mu.Lock()
	n, hook := f.n, f.during
	f.reads++
	f.during = nil
	f.mu.Unlock()
	if hook != nil {
		hook()
	}
	return n, nil
}

// TestReservationsHoldUntilTheStoreHoldsTheirWrites drives the ledger's
// reservations: writes let through at once cannot take the same room; a
// write that stored nothing gives its room back at once; one that landed
// keeps it until a read of the store begun after it (not one already
// under way, which may have missed it).
func TestReservationsHoldUntilTheStoreHoldsTheirWrites(t *testing.T) {
	ctx := context.Background()
	clock := conformance.NewFakeClock(time.Time{})
	l := httpapi.NewUsageLedger()
	l.Clock = clock
	store := &fakeStoredBytes{}
	reserve := func(n int64) *httpapi.Reservation {
		t.Helper()
		r, _, _, err := l.ReserveStoredBytes(ctx, store, "acme", n, 250)
		require.NoError(t, err)
		return r
	}

	r1, r2 := reserve(100), reserve(100)
	require.NotNil(t, r1)
	require.NotNil(t, r2)
	refused, held, reserved, err := l.ReserveStoredBytes(ctx, store, "acme", 100, 250)
	require.NoError(t, err)
	require.Nil(t, refused, "a third write of 100 bytes fits a quota of 250 with two reserved")
	require.Equal(t, [2]int64{0, 200}, [2]int64{held, reserved})

	r1.Cancel() // stored nothing
	require.Equal(t, int64(100), l.ReservedStoredBytes("acme"))
	r3 := reserve(100)
	require.NotNil(t, r3)

	// r2 lands; the figure is not read again before it is StoredBytesMaxAge
	// old, so r2 still counts.
	r2.Landed()
	store.set(100)
	require.Nil(t, reserve(100))
	require.Equal(t, int64(200), l.ReservedStoredBytes("acme"))

	// The next read holds r2's write: r2 is released, r3 (in flight) is
	// not. r3 lands while that read is under way: the read may have missed
	// it, so r3 stays until the read after.
	clock.Advance(httpapi.StoredBytesMaxAge)
	store.during = r3.Landed
	r4 := reserve(50) // 100 held + 100 (r3) + 50 = 250
	require.NotNil(t, r4)
	require.Equal(t, int64(150), l.ReservedStoredBytes("acme"))
	r4.Cancel()
	clock.Advance(httpapi.StoredBytesMaxAge)
	store.set(200)
	n, err := l.StoredBytes(ctx, store, "acme")
	require.NoError(t, err)
	require.Equal(t, int64(200), n)
	require.Zero(t, l.ReservedStoredBytes("acme"), "r3 landed before this read began")
	require.Equal(t, 3, store.reads)

	// Settling twice, or a nil reservation, changes nothing.
	r3.Cancel()
	r2.Landed()
	var none *httpapi.Reservation
	none.Landed()
	none.Cancel()
	require.Zero(t, l.ReservedStoredBytes("acme"))
}
