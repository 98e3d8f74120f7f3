package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The tests here open a Store for each process that holds a node name,
// on one database and schema, as processes on several machines would.

// TestARestartUnderItsNodeNameTakesItsSessionsBackAtOnce: process a holds
// node name "n" and owns a session; it dies (its name's connection ends,
// as at a kill -9) with its lease still running for 15 s. Process b,
// started under the same name, holds it, finds the session orphaned and
// claims it with the epoch bumped, on a clock that has not moved: no
// wait for the old lease. An old process that was only paused is then
// fenced at its next commit and its next renewal.
func TestARestartUnderItsNodeNameTakesItsSessionsBackAtOnce(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Time{})
	a, b := open(t, dsn, schema, clock), open(t, dsn, schema, clock)
	ctx := context.Background()
	now := func() int64 { return clock.Now().UnixMilli() }
	const old, fresh = "n/first", "n/second"
	releaseA, err := a.HoldNodeName(ctx, "n", old)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.RegisterNode(ctx, old, now()+15_000); err != nil {
		t.Fatal(err)
	}
	ea, err := a.ClaimSession(ctx, "t", "s", old, now())
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(t, a, "t", "s", "r", now())
	c := step(t, r, ea, "", loop.Event{Type: loop.EventRunStarted})
	if _, err := a.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	r = c.Run
	releaseA() // a's process dies: the server ends its connections

	releaseB, err := b.HoldNodeName(ctx, "n", fresh)
	if err != nil {
		t.Fatalf("the restart under node name n: %v", err)
	}
	defer releaseB()
	if err := b.RegisterNode(ctx, fresh, now()+15_000); err != nil {
		t.Fatal(err)
	}
	orphans, err := b.OrphanedSessions(ctx, now())
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 1 || orphans[0].Session != "s" || orphans[0].Owner != old {
		t.Fatalf("orphans after the restart, on a clock 0 s into a 15 s lease: %+v; want session s of %s", orphans, old)
	}
	eb, err := b.ClaimSession(ctx, "t", "s", fresh, now())
	if err != nil || eb != ea+1 {
		t.Fatalf("the restart's claim: epoch %d, %v; want %d", eb, err, ea+1)
	}
	_, err = a.Commit(ctx, step(t, r, ea, "late", planned()))
	wantErr(t, err, runtime.ErrFenced, "the previous incarnation's commit after the restart's claim")
	if err := a.RenewNode(ctx, old, now()+15_000); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("the previous incarnation's renewal after the restart: %v; want ErrNodeExpired", err)
	}
	if _, err := b.Commit(ctx, step(t, r, eb, "late", planned())); err != nil {
		t.Fatalf("the restart's commit: %v", err)
	}
}

// TestASecondLiveProcessUnderOneNodeNameIsRefused: while process a holds
// node name "n", process b is refused the name with ErrNodeNameHeld and a
// message that names node.name, and a's incarnation stays alive with its
// session; another name is free. Once a releases the name (it stops or
// dies), b may take it.
func TestASecondLiveProcessUnderOneNodeNameIsRefused(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Time{})
	a, b := open(t, dsn, schema, clock), open(t, dsn, schema, clock)
	ctx := context.Background()
	now := func() int64 { return clock.Now().UnixMilli() }
	releaseA, err := a.HoldNodeName(ctx, "n", "n/first")
	if err != nil {
		t.Fatal(err)
	}
	defer releaseA()
	if err := a.RegisterNode(ctx, "n/first", now()+15_000); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ClaimSession(ctx, "t", "s", "n/first", now()); err != nil {
		t.Fatal(err)
	}
	newRun(t, a, "t", "s", "r", now())

	_, err = b.HoldNodeName(ctx, "n", "n/second")
	if !errors.Is(err, runtime.ErrNodeNameHeld) || !strings.Contains(err.Error(), "node.name") {
		t.Fatalf("a second live process under node name n: %v; want ErrNodeNameHeld naming node.name", err)
	}
	if err := a.RenewNode(ctx, "n/first", now()+15_000); err != nil {
		t.Fatalf("the live holder's renewal after the refusal: %v", err)
	}
	if orphans, err := b.OrphanedSessions(ctx, now()); err != nil || len(orphans) != 0 {
		t.Fatalf("orphans after the refusal: %+v, %v; want none", orphans, err)
	}
	releaseM, err := b.HoldNodeName(ctx, "m", "m/first")
	if err != nil {
		t.Fatalf("another name while n is held: %v", err)
	}
	releaseM()
	if _, err := b.HoldNodeName(ctx, "n/x", "n/x/first"); !errors.Is(err, runtime.ErrInvalidRequest) {
		t.Fatalf("a name with a slash: %v; want ErrInvalidRequest", err)
	}

	releaseA()
	releaseB, err := b.HoldNodeName(ctx, "n", "n/second")
	if err != nil {
		t.Fatalf("node name n after its holder released it: %v", err)
	}
	releaseB()
}

// TestTheServersIdleTimeoutDoesNotFreeANodeName: on a server that ends
// idle sessions (idle_session_timeout), the statement HoldNodeName runs
// on the node name's connection keeps it: a connection whose
// idle_session_timeout is 300 ms runs it (in the same query message, so
// that it is never idle with the timeout on), and outlives a probe
// connection with the same timeout that the server ends for its
// idleness. Without the statement, the server ends both.
func TestTheServersIdleTimeoutDoesNotFreeANodeName(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	ctx := context.Background()
	observer, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close(ctx)
	var version int
	if err := observer.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 140000 {
		t.Skipf("PostgreSQL %d has no idle_session_timeout", version)
	}
	held, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(ctx)
	// The simple protocol sends both statements in one message.
	if _, err := held.Exec(ctx, `SET idle_session_timeout = '300ms'; `+sqlNodeNameSessionTimeoutsOff, pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	probe, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close(ctx)
	if _, err := probe.Exec(ctx, `SET idle_session_timeout = '300ms'`); err != nil {
		t.Fatal(err)
	}
	pid := probe.PgConn().PID()
	eventually(t, "the server to end an idle session (idle_session_timeout)", 30*time.Second, func() bool {
		var alive bool
		err := observer.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive)
		return err == nil && !alive
	})
	var setting string
	if err := held.QueryRow(ctx, `SELECT current_setting('idle_session_timeout')`).Scan(&setting); err != nil {
		t.Fatalf("the node name's connection after the server ended idle sessions: %v", err)
	}
	if setting != "0" {
		t.Fatalf("idle_session_timeout on the node name's connection is %q, want 0", setting)
	}
}
