package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/runtime"
)

// The tests here stop a batch claim in the middle: another connection
// holds the row lock of one of its sessions, so the batch has run its
// statements up to that session's lock and waits there until the test
// lets it go.

// lockHolder is a transaction of its own on the database that holds the
// row lock of one session.
type lockHolder struct {
	conn *pgx.Conn
	pid  uint32
}

// holdSessionLock locks the row of tenant/session in schema, which must
// exist, until release. The holder is released at cleanup too, so that a
// batch waiting for it ends even when the test fails first.
func holdSessionLock(t *testing.T, dsn, schema, tenant, session string) *lockHolder {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	h := &lockHolder{conn: conn, pid: conn.PgConn().PID()}
	t.Cleanup(h.release)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	var one int
	err = conn.QueryRow(ctx, "SELECT 1 FROM "+schema+".sessions WHERE tenant = $1 AND session = $2 FOR UPDATE", tenant, session).Scan(&one)
	if err != nil {
		t.Fatalf("lock the row of %s/%s: %v", tenant, session, err)
	}
	return h
}

// release rolls the holder's transaction back and closes its connection.
// It is safe to call more than once.
func (h *lockHolder) release() {
	if h.conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = h.conn.Close(ctx)
}

// blocking reports how many backends wait for a lock the holder holds.
func (h *lockHolder) blocking(t *testing.T, monitor *pgx.Conn) int {
	t.Helper()
	var n int
	err := monitor.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))", int32(h.pid)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// claimResult is what a ClaimSessions call running in a goroutine
// returned.
type claimResult struct {
	claims []runtime.SessionClaim
	err    error
}

func claimInBackground(s *Store, nodeID string, nowMS int64, batch []runtime.SessionRef) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, err := s.ClaimSessions(ctx, nodeID, nowMS, batch)
		done <- claimResult{c, err}
	}()
	return done
}

// ownersOf lists tenant "t"'s active sessions as session=owner@epoch.
func ownersOf(t *testing.T, s *Store) string {
	t.Helper()
	got, err := s.ActiveSessions(context.Background(), "", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, o := range got {
		out = append(out, fmt.Sprintf("%s=%s@%d", o.Session, o.Owner, o.Epoch))
	}
	return strings.Join(out, " ")
}

// TestClaimSessionsRefusedForAnExpiredNodeKeepsNoClaims: the claiming
// node's lease runs out while its batch is midway, waiting for the lock
// of its second session; the first session's claim is written by then.
// The lease is judged once, when the batch begins, and the node was alive
// then, so the batch claims all three. (Judged again at each session, as
// it was, the lease refused the batch with ErrNodeExpired there, and the
// COMMIT queued behind it kept the first session's claim.)
func TestClaimSessionsRefusedForAnExpiredNodeKeepsNoClaims(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Time{})
	s := open(t, dsn, schema, clock)
	ctx := context.Background()
	for _, session := range []string{"s1", "s2", "s3"} {
		newRun(t, s, "t", session, "r-"+session, 1)
	}
	if err := s.RegisterNode(ctx, "n", clock.Now().Add(10*time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	holder := holdSessionLock(t, dsn, schema, "t", "s2")
	monitor := connect(t, dsn)
	done := claimInBackground(s, "n", clock.Now().UnixMilli(),
		[]runtime.SessionRef{{Tenant: "t", Session: "s3"}, {Tenant: "t", Session: "s1"}, {Tenant: "t", Session: "s2"}})
	eventually(t, "the batch to wait for the lock of t/s2", time.Minute, func() bool { return holder.blocking(t, monitor) > 0 })

	// The lease runs out, and the renewal that finds it so marks the node
	// dead for good, while the batch waits.
	clock.Advance(11 * time.Second)
	err := s.RenewNode(ctx, "n", clock.Now().Add(10*time.Second).UnixMilli())
	wantErr(t, err, runtime.ErrNodeExpired, "renewal after the lease ran out")
	holder.release()
	res := <-done

	owners := ownersOf(t, s)
	if errors.Is(res.err, runtime.ErrNodeExpired) {
		t.Fatalf("ClaimSessions refused with %v, yet kept claims: the sessions are %s (s1=@0 s2=@0 s3=@0 is none)", res.err, owners)
	}
	if res.err != nil {
		t.Fatalf("ClaimSessions: %v", res.err)
	}
	for i, c := range res.claims {
		if c.Err != nil || c.Epoch != 1 || len(c.Active) != 1 {
			t.Fatalf("claim %d: %+v; want epoch 1 and its one active Run", i, c)
		}
	}
	if want := "s1=n@1 s2=n@1 s3=n@1"; owners != want {
		t.Fatalf("after the batch the sessions are %s, want %s", owners, want)
	}
}

// TestClaimSessionsByADeadNodeStopsBeforeItsFirstClaim: a batch of a node
// whose lease ran out before it began is refused with ErrNodeExpired
// before it writes or locks anything: it does not wait for the lock of a
// session another transaction holds, creates no session's row, and
// leaves the rows there as they were.
func TestClaimSessionsByADeadNodeStopsBeforeItsFirstClaim(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Time{})
	s := open(t, dsn, schema, clock)
	ctx := context.Background()
	newRun(t, s, "t", "s2", "r", 1)
	if err := s.RegisterNode(ctx, "n", clock.Now().Add(time.Second).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	holder := holdSessionLock(t, dsn, schema, "t", "s2")
	monitor := connect(t, dsn)
	done := claimInBackground(s, "n", clock.Now().UnixMilli(),
		[]runtime.SessionRef{{Tenant: "t", Session: "s1"}, {Tenant: "t", Session: "s2"}, {Tenant: "t", Session: "s3"}})
	var (
		res     claimResult
		blocked bool
	)
	eventually(t, "the batch to return or to wait for the lock of t/s2", time.Minute, func() bool {
		select {
		case res = <-done:
			return true
		default:
		}
		blocked = holder.blocking(t, monitor) > 0
		return blocked
	})
	if blocked {
		holder.release()
		res = <-done
		t.Fatalf("the dead node's batch went on to wait for the lock of t/s2 (it returned %v once let go)", res.err)
	}
	wantErr(t, res.err, runtime.ErrNodeExpired, "ClaimSessions by a node whose lease ran out")
	holder.release()
	var sessions string
	query(t, dsn, "SELECT string_agg(session || '=' || owner || '@' || epoch, ' ' ORDER BY session) FROM "+schema+".sessions", &sessions)
	if sessions != "s2=@0" {
		t.Fatalf("sessions on record after the refused batch: %s; want only s2, unclaimed (s2=@0)", sessions)
	}
}
