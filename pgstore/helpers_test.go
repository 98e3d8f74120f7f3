package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// logTo is a logger that writes through t.Log, for tests that want to see
// what the store says.
func logTo(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

var _ io.Writer = tWriter{}

// heldBatches holds the first batch of writes (of KV writes, or a group
// of commits and creations) back until release, and records every
// batch's size. onLater, when set, is called with each later batch's
// size before it is written.
type heldBatches struct {
	mu       sync.Mutex
	sizes    []int
	entered  chan struct{} // closed when the first batch is held
	released chan struct{}
	release  func() // lets the first batch go; safe to call more than once
	onLater  func(n int)
}

// newHeldBatches makes a hold that t's cleanup releases, ahead of the
// cleanups registered before it (the Store's Close): a test that fails
// while a batch is held lets it end instead of waiting for it forever.
func newHeldBatches(t *testing.T) *heldBatches {
	h := &heldBatches{entered: make(chan struct{}), released: make(chan struct{})}
	h.release = sync.OnceFunc(func() { close(h.released) })
	t.Cleanup(h.release)
	return h
}

// hook is the store's hook for a batch of n writes.
func (h *heldBatches) hook(n int) {
	h.mu.Lock()
	h.sizes = append(h.sizes, n)
	first, later := len(h.sizes) == 1, h.onLater
	h.mu.Unlock()
	if first {
		close(h.entered)
		<-h.released
	} else if later != nil {
		later(n)
	}
}

func (h *heldBatches) batchSizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

// untilCount waits, 10 s at most, until count returns n.
func untilCount(t *testing.T, what string, n int, count func() int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for got := count(); got != n; got = count() {
		if time.Now().After(deadline) {
			t.Fatalf("%d %s after 10 s; want %d", got, what, n)
		}
		time.Sleep(time.Millisecond)
	}
}

var schemaSeq atomic.Int64

// freshSchema names a schema no other test of this process uses on the
// database dsn, and drops it at cleanup.
func freshSchema(t testing.TB, dsn string) string {
	t.Helper()
	name := fmt.Sprintf("case_%d", schemaSeq.Add(1))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Logf("drop schema %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Logf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// open opens a Store on dsn and schema, closed at cleanup.
func open(t testing.TB, dsn, schema string, clock runtime.Clock) *Store {
	t.Helper()
	s, err := Open(context.Background(), Options{DSN: dsn, Schema: schema, Clock: clock, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// query runs one query on dsn and scans its single row into dest.
func query(t testing.TB, dsn, q string, dest ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, q).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// eventually waits, up to a deadline, for cond.
func eventually(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// newRun creates a Run through s and returns its snapshot.
func newRun(t testing.TB, s runtime.Store, tenant, session, id string, at int64) loop.Run {
	t.Helper()
	spec := loop.Spec{Tenant: tenant, Session: session, ID: id, Input: "hello",
		Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy}
	ev := loop.RunCreated(spec, at)
	r, err := loop.Apply(loop.Run{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	ev.Seq = 1
	res, err := s.CreateRun(context.Background(), runtime.CreateRun{Run: r, Event: ev})
	if err != nil {
		t.Fatal(err)
	}
	return res.Run
}

// step applies evs to r and returns the Commit that records them.
func step(t testing.TB, r loop.Run, epoch uint64, cmd string, evs ...loop.Event) runtime.Commit {
	t.Helper()
	c := runtime.Commit{Tenant: r.Tenant, Session: r.Session, RunID: r.ID, CommandID: cmd, ExpectedSeq: r.Seq, Epoch: epoch}
	for _, ev := range evs {
		next, err := loop.Apply(r, ev)
		if err != nil {
			t.Fatalf("apply %s: %v", ev.Type, err)
		}
		ev.Seq = next.Seq
		c.Events = append(c.Events, ev)
		r = next
	}
	c.Run = r
	return c
}

// toExecuting drives a fresh Run to an executing model effect.
func toExecuting(t testing.TB, s runtime.Store, r loop.Run, epoch uint64) loop.Run {
	t.Helper()
	ctx := context.Background()
	c := step(t, r, epoch, "", loop.Event{Type: loop.EventRunStarted},
		loop.Event{Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{"model":"test"}`)})
	if _, err := s.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	c = step(t, c.Run, epoch, "", loop.Event{Type: loop.EventEffectDispatched, EffectID: loop.ModelEffectID(r.ID, 1), Attempt: 1, Epoch: epoch})
	if _, err := s.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c.Run
}

// pendingEvent is an EffectPending of r's model effect with handle.
func pendingEvent(r loop.Run, handle string) loop.Event {
	return loop.Event{Type: loop.EventEffectPending, EffectID: loop.ModelEffectID(r.ID, 1), Attempt: 1, Handle: handle}
}

func wantErr(t testing.TB, err, target error, what string) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

var _ = conformance.NewFakeClock
