package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// The tests here open two Stores on one database and schema, as two nodes
// (two processes) would.

// TestConcurrentCommitsFromTwoNodes races committers of two Stores on the
// same Runs with compare-and-set: every Seq has exactly one winner, and
// the log holds exactly the winners, in order.
func TestConcurrentCommitsFromTwoNodes(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	nodes := []*Store{open(t, dsn, schema, nil), open(t, dsn, schema, nil)}
	ctx := context.Background()
	const (
		runs    = 2
		workers = 4 // per node
		rounds  = 15
	)
	for i := range runs {
		toExecuting(t, nodes[0], newRun(t, nodes[0], "t", "hot", fmt.Sprintf("r%d", i), 1), 0)
	}
	var (
		mu   sync.Mutex
		wins = map[string]map[int64]string{} // run → Seq → handle
	)
	var wg sync.WaitGroup
	errs := make(chan error, len(nodes)*workers)
	for n, s := range nodes {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					run := fmt.Sprintf("r%d", i%runs)
					handle := fmt.Sprintf("n%d-w%d-%d", n, w, i)
					for {
						r, err := s.LoadRun(ctx, "t", run)
						if err != nil {
							errs <- err
							return
						}
						ev := pendingEvent(r, handle)
						next, err := loop.Apply(r, ev)
						if err != nil {
							errs <- err
							return
						}
						ev.Seq = next.Seq
						res, err := s.Commit(ctx, runtime.Commit{Tenant: "t", Session: "hot", RunID: run, CommandID: "cmd-" + handle,
							ExpectedSeq: r.Seq, Events: []loop.Event{ev}, Run: next})
						if errors.Is(err, runtime.ErrVersionConflict) {
							continue
						}
						if err != nil || res.Duplicate || res.Seq != next.Seq {
							errs <- fmt.Errorf("commit %s: %+v, %v", handle, res, err)
							return
						}
						mu.Lock()
						if wins[run] == nil {
							wins[run] = map[int64]string{}
						}
						if prev, dup := wins[run][next.Seq]; dup {
							mu.Unlock()
							errs <- fmt.Errorf("Seq %d of %s won twice: %s and %s", next.Seq, run, prev, handle)
							return
						}
						wins[run][next.Seq] = handle
						mu.Unlock()
						break
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	total := 0
	for run, bySeq := range wins {
		total += len(bySeq)
		evs, err := nodes[1].Events(ctx, "t", run, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 4+len(bySeq) {
			t.Fatalf("%s: %d events for %d winners after 4", run, len(evs), len(bySeq))
		}
		for _, ev := range evs[4:] {
			if ev.Handle != bySeq[ev.Seq] {
				t.Fatalf("%s Seq %d holds %q, the winner was %q", run, ev.Seq, ev.Handle, bySeq[ev.Seq])
			}
		}
	}
	if total != len(nodes)*workers*rounds {
		t.Fatalf("%d winners, want %d", total, len(nodes)*workers*rounds)
	}
}

// TestTheEpochFencesAcrossNodes: node-a on one Store owns a session; a
// claim through the other Store is refused while node-a lives, and once
// node-a's lease ran out node-b takes the session over, after which
// node-a's commits are fenced.
func TestTheEpochFencesAcrossNodes(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Time{})
	a, b := open(t, dsn, schema, clock), open(t, dsn, schema, clock)
	ctx := context.Background()
	now := func() int64 { return clock.Now().UnixMilli() }
	if err := a.RegisterNode(ctx, "node-a", now()+10_000); err != nil {
		t.Fatal(err)
	}
	ea, err := a.ClaimSession(ctx, "t", "s", "node-a", now())
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(t, a, "t", "s", "r", now())
	c := step(t, r, ea, "", loop.Event{Type: loop.EventRunStarted})
	if _, err := a.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	r = c.Run
	if err := b.RegisterNode(ctx, "node-b", now()+10_000); err != nil {
		t.Fatal(err)
	}
	_, err = b.ClaimSession(ctx, "t", "s", "node-b", now())
	var owned *runtime.SessionOwnedError
	if !errors.As(err, &owned) || owned.Owner != "node-a" || owned.Epoch != ea {
		t.Fatalf("claim through b of node-a's session: %v; want a SessionOwnedError naming node-a at epoch %d", err, ea)
	}
	clock.Advance(11 * time.Second)
	if err := b.RenewNode(ctx, "node-b", now()+10_000); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("renewal of node-b after its lease ran out: %v", err)
	}
	if err := b.RegisterNode(ctx, "node-c", now()+10_000); err != nil {
		t.Fatal(err)
	}
	ec, err := b.ClaimSession(ctx, "t", "s", "node-c", now())
	if err != nil || ec != ea+1 {
		t.Fatalf("takeover by node-c through b: epoch %d, %v; want %d", ec, err, ea+1)
	}
	_, err = a.Commit(ctx, step(t, r, ea, "late", planned()))
	wantErr(t, err, runtime.ErrFenced, "node-a's commit through a after the takeover")
	if _, err := b.Commit(ctx, step(t, r, ec, "late", planned())); err != nil {
		t.Fatalf("node-c's commit through b: %v", err)
	}
	if _, err := a.ClaimSession(ctx, "t", "s", "node-a", now()); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("node-a claiming back: %v", err)
	}
}

func planned() loop.Event {
	return loop.Event{Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{"model":"test"}`)}
}

// TestKVQuotaHoldsAcrossNodes: writers on two Stores fill one plugin's
// quota at once; exactly as many entries as fit are written, and the
// recorded usage is what the entries hold.
func TestKVQuotaHoldsAcrossNodes(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	opts := Options{DSN: dsn, Schema: schema, Logger: quietLogger(), KVQuotaBytes: 1000}
	var nodes []*Store
	for range 2 {
		s, err := Open(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		nodes = append(nodes, s)
	}
	ctx := context.Background()
	const writers, perWriter = 6, 10 // per node: 120 entries of 50 bytes, 20 fit
	var (
		mu            sync.Mutex
		stored, quota int
	)
	var wg sync.WaitGroup
	errs := make(chan error, 2*writers)
	for n, s := range nodes {
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWriter {
					key := fmt.Sprintf("n%d-w%d-%02d", n, w, i) // 8 bytes
					err := s.KVSet(ctx, "t", "p", []byte(key), []byte(strings.Repeat("v", 42)))
					mu.Lock()
					switch {
					case err == nil:
						stored++
					case errors.Is(err, runtime.ErrKVQuota):
						quota++
					default:
						errs <- err
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if stored != 20 || quota != 2*writers*perWriter-20 {
		t.Fatalf("%d writes stored, %d refused; want exactly the 20 that fit", stored, quota)
	}
	var entries, held, usage int64
	query(t, dsn, "SELECT count(*), coalesce(sum(octet_length(key) + octet_length(value)), 0) FROM "+schema+".kv", &entries, &held)
	query(t, dsn, "SELECT bytes FROM "+schema+".kv_usage", &usage)
	if entries != 20 || held != 1000 || usage != held {
		t.Fatalf("%d entries hold %d bytes, usage says %d; want 20, 1000, 1000", entries, held, usage)
	}
}

// TestLeasesUseTheDatabaseClock: with no Options.Clock, a lease is the
// database's now plus the TTL the caller meant, and a claim is judged by
// the database's now, whatever the caller's clock says.
func TestLeasesUseTheDatabaseClock(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	s := open(t, dsn, schema, nil)
	ctx := context.Background()
	if err := s.RegisterNode(ctx, "n", time.Now().Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	var ttl int64
	query(t, dsn, "SELECT expires_ms - (extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM "+schema+".nodes", &ttl)
	if ttl < time.Hour.Milliseconds()-60_000 || ttl > time.Hour.Milliseconds() {
		t.Fatalf("a one-hour lease runs %d ms past the database's now", ttl)
	}
	// A caller whose clock is a day ahead still claims: the database says
	// the node lives.
	if _, err := s.ClaimSession(ctx, "t", "s", "n", time.Now().Add(24*time.Hour).UnixMilli()); err != nil {
		t.Fatalf("claim with a caller's clock a day ahead: %v", err)
	}
	newRun(t, s, "t", "s", "r", 1)
	if got, err := s.OrphanedSessions(ctx, time.Now().Add(24*time.Hour).UnixMilli()); err != nil || len(got) != 0 {
		t.Fatalf("orphans by a clock a day ahead: %+v, %v; want none", got, err)
	}
	// A short lease runs out by the database's clock, and stays dead.
	if err := s.RegisterNode(ctx, "short", time.Now().Add(50*time.Millisecond).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the 50 ms lease to run out", 10*time.Second, func() bool {
		_, err := s.ClaimSession(ctx, "t", "other", "short", time.Now().UnixMilli())
		return errors.Is(err, runtime.ErrNodeExpired)
	})
	if err := s.RenewNode(ctx, "short", time.Now().Add(time.Hour).UnixMilli()); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("renewing the expired incarnation: %v", err)
	}
	if err := s.RegisterNode(ctx, "short", time.Now().Add(time.Hour).UnixMilli()); !errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("registering the dead incarnation again: %v", err)
	}
	var dead bool
	query(t, dsn, "SELECT dead FROM "+schema+".nodes WHERE node_id = 'short'", &dead)
	if !dead {
		t.Fatal("the expired incarnation is not marked dead")
	}
}

// TestACommitCannotReviveAnEndedRun: the loop never takes a Run out of a
// terminal status; a commit that would is malformed, and writes nothing
// (the session's count of live Runs stays right).
func TestACommitCannotReviveAnEndedRun(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	s := open(t, dsn, freshSchema(t, dsn), nil)
	ctx := context.Background()
	r := newRun(t, s, "t", "s", "r", 1)
	c := step(t, r, 0, "", loop.Event{Type: loop.EventCancelRequested, Reason: "user"}, loop.Event{Type: loop.EventRunCancelled})
	if _, err := s.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	ended := c.Run
	// loop.Apply refuses any event now; build the commit by hand.
	revive := runtime.Commit{Tenant: "t", Session: "s", RunID: "r", ExpectedSeq: ended.Seq, Run: ended,
		Events: []loop.Event{{Type: loop.EventRunStarted, Seq: ended.Seq + 1}}}
	revive.Run.Seq, revive.Run.Status = ended.Seq+1, loop.StatusRunning
	_, err := s.Commit(ctx, revive)
	wantErr(t, err, runtime.ErrInvalidRequest, "a commit that revives a cancelled Run")
	if got, err := s.LoadRun(ctx, "t", "r"); err != nil || got.Seq != ended.Seq || got.Status != loop.StatusCancelled {
		t.Fatalf("after the refused revival: %+v, %v", got, err)
	}
	if got, err := s.ActiveSessions(ctx, "", "", 0); err != nil || len(got) != 0 {
		t.Fatalf("active sessions = %+v, %v; want none", got, err)
	}
}

// TestARefusedCreationLeavesNoSession: CreateRun writes nothing when it
// refuses (run ID used) or answers a repeated command, not even the row
// of a session it named for the first time; a claimed session's row stays.
func TestARefusedCreationLeavesNoSession(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	s := open(t, dsn, schema, nil)
	ctx := context.Background()
	req := createReq(t, "t", "s", "r")
	req.CommandID = "submit-1"
	if _, err := s.CreateRun(ctx, req); err != nil {
		t.Fatal(err)
	}
	again := createReq(t, "t", "fresh1", "r2")
	again.CommandID = "submit-1"
	if res, err := s.CreateRun(ctx, again); err != nil || !res.Duplicate || res.Run.ID != "r" || res.Ordinal != 1 {
		t.Fatalf("repeated command: %+v, %v", res, err)
	}
	_, err := s.CreateRun(ctx, createReq(t, "t", "fresh2", "r"))
	wantErr(t, err, runtime.ErrRunExists, "a used run ID in a new session")
	if err := s.RegisterNode(ctx, "n", time.Now().Add(time.Minute).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimSession(ctx, "t", "claimed", "n", 0); err != nil {
		t.Fatal(err)
	}
	_, err = s.CreateRun(ctx, createReq(t, "t", "claimed", "r"))
	wantErr(t, err, runtime.ErrRunExists, "a used run ID in a claimed session")
	var sessions string
	query(t, dsn, "SELECT string_agg(session, ',' ORDER BY session) FROM "+schema+".sessions", &sessions)
	if sessions != "claimed,s" {
		t.Fatalf("sessions on record: %s; want claimed,s", sessions)
	}
}

// TestRacingClaimsHaveOneWinner: live nodes on two Stores claim one fresh
// session at once; exactly one takes it, at epoch 1, and every other is
// told that one owns it.
func TestRacingClaimsHaveOneWinner(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	stores := []*Store{open(t, dsn, schema, nil), open(t, dsn, schema, nil)}
	ctx := context.Background()
	const claimers = 8
	for i := range claimers {
		if err := stores[i%2].RegisterNode(ctx, fmt.Sprintf("n%d", i), time.Now().Add(time.Minute).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		epochs = make([]uint64, claimers)
		errs   = make([]error, claimers)
	)
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			epochs[i], errs[i] = stores[i%2].ClaimSession(ctx, "t", "s", fmt.Sprintf("n%d", i), 0)
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 || epochs[i] != 1 {
				t.Fatalf("n%d and n%d both claimed, or epoch %d: %v", winner, i, epochs[i], epochs)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatalf("no claim won: %v", errs)
	}
	for i, err := range errs {
		var owned *runtime.SessionOwnedError
		if i != winner && (!errors.As(err, &owned) || owned.Owner != fmt.Sprintf("n%d", winner) || owned.Epoch != 1) {
			t.Fatalf("n%d: %v; want owned by n%d at epoch 1", i, err, winner)
		}
	}
}

// TestLiveNodesCountsTheLiveIncarnations: LiveNodes counts the nodes
// whose lease runs at the store's now, over every Store on the schema;
// an incarnation whose lease ran out drops out of the count.
func TestLiveNodesCountsTheLiveIncarnations(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	clock := conformance.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a, b := open(t, dsn, schema, clock), open(t, dsn, schema, clock)
	ctx := context.Background()
	count := func(s *Store) int {
		t.Helper()
		n, err := s.LiveNodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(a); n != 0 {
		t.Fatalf("%d live nodes before any registered", n)
	}
	now := clock.Now().UnixMilli()
	if err := a.RegisterNode(ctx, "node-a", now+10_000); err != nil {
		t.Fatal(err)
	}
	if err := b.RegisterNode(ctx, "node-b", now+30_000); err != nil {
		t.Fatal(err)
	}
	if na, nb := count(a), count(b); na != 2 || nb != 2 {
		t.Fatalf("live nodes %d and %d, want 2 from each store", na, nb)
	}
	clock.Advance(15 * time.Second)
	if n := count(b); n != 1 {
		t.Fatalf("%d live nodes once node-a's lease ran out, want 1", n)
	}
	var _ runtime.NodeCounter = a
}

// TestRacingBatchClaimsHaveOneWinnerEach: four nodes, on two Stores,
// claim the same sessions at once in batches that name them in different
// orders, new sessions and sessions with Runs alike. Each session goes to
// exactly one of them, at epoch 1, the others get its SessionOwnedError,
// and no batch fails: the batches make and lock their rows in one order,
// so none deadlocks with another.
func TestRacingBatchClaimsHaveOneWinnerEach(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	schema := freshSchema(t, dsn)
	stores := []*Store{open(t, dsn, schema, nil), open(t, dsn, schema, nil)}
	ctx := context.Background()
	const (
		claimers = 4
		sessions = 64
	)
	for i := range claimers {
		if err := stores[i%2].RegisterNode(ctx, fmt.Sprintf("n%d", i), time.Now().Add(time.Minute).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 5 {
		refs := make([]runtime.SessionRef, sessions)
		for j := range refs {
			refs[j] = runtime.SessionRef{Tenant: fmt.Sprintf("t%d", j%3), Session: fmt.Sprintf("r%d-s%02d", round, j)}
			if j%2 == 0 { // a session with a Run, and so a row, before the claims
				newRun(t, stores[0], refs[j].Tenant, refs[j].Session, fmt.Sprintf("run-%d-%d", round, j), 1)
			}
		}
		var (
			wg     sync.WaitGroup
			start  = make(chan struct{})
			claims = make([][]runtime.SessionClaim, claimers)
			errs   = make([]error, claimers)
		)
		for i := range claimers {
			batch := slices.Clone(refs)
			rand.New(rand.NewPCG(uint64(round), uint64(i))).Shuffle(len(batch), func(a, b int) { batch[a], batch[b] = batch[b], batch[a] })
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				claims[i], errs[i] = stores[i%2].ClaimSessions(ctx, fmt.Sprintf("n%d", i), 0, batch)
				// Back in refs' order, to compare.
				byRef := map[runtime.SessionRef]runtime.SessionClaim{}
				for k, c := range claims[i] {
					byRef[batch[k]] = c
				}
				for k, ref := range refs {
					claims[i][k] = byRef[ref]
				}
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: n%d's batch failed: %v", round, i, err)
			}
		}
		for j, ref := range refs {
			winner := -1
			for i := range claimers {
				if claims[i][j].Err == nil {
					if winner >= 0 || claims[i][j].Epoch != 1 {
						t.Fatalf("round %d, %s/%s: n%d and n%d both claimed it, or epoch %d", round, ref.Tenant, ref.Session, winner, i, claims[i][j].Epoch)
					}
					winner = i
				}
			}
			if winner < 0 {
				t.Fatalf("round %d, %s/%s: no claim won", round, ref.Tenant, ref.Session)
			}
			for i := range claimers {
				var owned *runtime.SessionOwnedError
				if i != winner && (!errors.As(claims[i][j].Err, &owned) || owned.Owner != fmt.Sprintf("n%d", winner) || owned.Epoch != 1) {
					t.Fatalf("round %d, %s/%s, n%d: %v; want owned by n%d at epoch 1", round, ref.Tenant, ref.Session, i, claims[i][j].Err, winner)
				}
			}
		}
	}
}
