package bench

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestChaosShort is the short chaos run of docs/DESIGN.md §9: `agenthost bench
// chaos` for 60 s of faults against the built binary, which it SIGKILLs,
// SIGSTOPs and restarts with SIGTERM under load. The bench itself checks
// the invariants over every acknowledged Run and fails with the violations
// it found; the test also checks that the run showed something: a kill, a
// pause and a graceful restart survived (the first three faults are one
// of each), and Runs of every kind acknowledged.
//
// AGENTHOST_CHAOS_SEED replays a seed (the log prints it);
// AGENTHOST_CHAOS_DURATION runs longer (e.g. 10m).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes a minute")
	}
	t.Parallel()                             // it waits on a child process most of the time
	args := chaosTestArgs(t, 60*time.Second) // of faults; plus start, drain and checks
	began := time.Now()
	out, err := runBench(t, benchPluginsDir(t), args...)
	var got struct {
		Result chaosResult `json:"result"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil {
		t.Fatalf("bench chaos (err %v) printed no JSON result: %v\n%s", err, jerr, out)
	}
	r := got.Result
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses, %d graceful restarts, %d Runs acknowledged %v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.Restarts, r.Acknowledged, r.ByStatus, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if len(r.UnusualEnds) > 0 {
		t.Logf("Runs that ended otherwise than their kind usually does: %q", r.UnusualEnds)
	}
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Kills < 1 || r.Pauses < 1 || r.Restarts < 1 {
		t.Errorf("seed %d: %d kills, %d pauses and %d graceful restarts; want at least one of each", r.Seed, r.Kills, r.Pauses, r.Restarts)
	}
	for _, kind := range chaosKinds {
		if r.Kinds[kind]["acknowledged"] == 0 {
			t.Errorf("seed %d: no Run of kind %s was acknowledged", r.Seed, kind)
		}
	}
	if r.Acknowledged == 0 || r.ByStatus["completed"] == 0 {
		t.Errorf("seed %d: %d Runs acknowledged, by status %v: the clients did no work", r.Seed, r.Acknowledged, r.ByStatus)
	}
}

// chaosTestArgs are the args of a short chaos run of duration, or of
// AGENTHOST_CHAOS_DURATION, with the seed AGENTHOST_CHAOS_SEED if set.
func chaosTestArgs(t *testing.T, duration time.Duration, extra ...string) []string {
	t.Helper()
	if s := os.Getenv("AGENTHOST_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("AGENTHOST_CHAOS_DURATION=%q: %v", s, err)
		}
		duration = d
	}
	args := append([]string{"--agenthost-bin", buildBinary(t), "chaos", "--duration", duration.String(), "--json"}, extra...)
	if s := os.Getenv("AGENTHOST_CHAOS_SEED"); s != "" {
		if _, err := strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("AGENTHOST_CHAOS_SEED=%q: %v", s, err)
		}
		args = append(args, "--seed", s)
	}
	return args
}

// TestChaosShortPostgres is TestChaosShort on PostgreSQL with three
// nodes: `agenthost bench chaos --store postgres --nodes 3`, which starts
// its own PostgreSQL server (fsync on) and three `serve` nodes on one
// database, for 25 s of faults under load: SIGKILL, SIGSTOP (the first
// one past the 5 s lease, so that the others take the paused node's
// sessions over and the node exits for its lost lease), SIGTERM, a
// partition of a node from PostgreSQL (past its lease: it must give the
// lease up before another node takes its sessions over, and exit) and a
// crash and restart of PostgreSQL itself. The clients submit round robin
// and follow each Run's events on another node. The bench checks the
// invariants with the same checks as on Badger, through pgstore, and
// that every event stream delivered the store's log; the test wants 0
// violations and at least one fault of each kind.
//
// AGENTHOST_CHAOS_SEED replays a seed (the log prints it);
// AGENTHOST_CHAOS_DURATION runs longer (e.g. 10m).
func TestChaosShortPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("the chaos run takes a minute")
	}
	if _, err := pgserver.FindBinaries(); err != nil {
		t.Fatalf("this test starts PostgreSQL: %v", err)
	}
	t.Parallel() // it waits on child processes most of the time
	args := chaosTestArgs(t, 25*time.Second, "--store", "postgres", "--nodes", "3", "--lease-ttl", "5s",
		"--fault-every", "1s-3s", "--pause", "500ms-1500ms")
	began := time.Now()
	out, err := runBench(t, benchPluginsDir(t), args...)
	var got struct {
		Result chaosResult `json:"result"`
	}
	if jerr := json.Unmarshal([]byte(out), &got); jerr != nil {
		t.Fatalf("bench chaos (err %v) printed no JSON result: %v\n%s", err, jerr, out)
	}
	r := got.Result
	t.Logf("seed %d (replay with AGENTHOST_CHAOS_SEED=%d): %d kills, %d pauses (%d past the lease), %d graceful restarts, %d PostgreSQL restarts %+v, %d partitions, %d lease-lost exits; %d Runs acknowledged %v, streams %+v, effects %v, recovery %v, %d violations, in %s",
		r.Seed, r.Seed, r.Kills, r.Pauses, r.PausesPastLease, r.Restarts, r.PgRestarts, r.PgRestartFigures, r.Partitions, r.LeaseLostExits, r.Acknowledged, r.ByStatus,
		r.Streams, r.EffectsSettled, r.Recovery, len(r.Violations), time.Since(began).Round(time.Second))
	if r.Takeovers != nil {
		t.Logf("takeovers: %+v", r.Takeovers.All)
	}
	if len(r.UnusualEnds) > 0 {
		t.Logf("Runs that ended otherwise than their kind usually does: %q", r.UnusualEnds)
	}
	if err != nil {
		t.Fatalf("bench chaos, seed %d: %v", r.Seed, err)
	}
	if len(r.Violations) != 0 {
		t.Fatalf("seed %d: violations: %q", r.Seed, r.Violations)
	}
	if r.Store != "postgres" || r.Nodes != 3 {
		t.Errorf("seed %d: ran on %d nodes of %s, want 3 of postgres", r.Seed, r.Nodes, r.Store)
	}
	if r.Kills < 1 || r.Pauses < 1 || r.Restarts < 1 || r.PgRestarts < 1 || r.Partitions < 1 {
		t.Errorf("seed %d: %d kills, %d pauses, %d graceful restarts, %d PostgreSQL restarts and %d partitions from PostgreSQL; want at least one of each",
			r.Seed, r.Kills, r.Pauses, r.Restarts, r.PgRestarts, r.Partitions)
	}
	if r.PausesPastLease < 1 {
		t.Errorf("seed %d: no pause past the lease (the first pause lasts 1.2 to 1.6 lease TTLs, and the node must exit for its lost lease)", r.Seed)
	}
	if r.Streams.CrossNode == 0 || r.Streams.Followed == 0 {
		t.Errorf("seed %d: event streams %+v: want Runs followed to their end on a node other than the one that acknowledged them", r.Seed, r.Streams)
	}
	for _, kind := range chaosKinds {
		if r.Kinds[kind]["acknowledged"] == 0 {
			t.Errorf("seed %d: no Run of kind %s was acknowledged", r.Seed, kind)
		}
	}
	if r.Acknowledged == 0 || r.ByStatus["completed"] == 0 {
		t.Errorf("seed %d: %d Runs acknowledged, by status %v: the clients did no work", r.Seed, r.Acknowledged, r.ByStatus)
	}
}

// TestChaosChecks shows that the chaos bench holds each Run's log to
// loop.LogCheck (whose own tests, TestCheckLog, show each rule catching a
// broken log) with the chaos clients' answers and the Run ended: a run of
// zero violations means something only if a broken log yields some.
func TestChaosChecks(t *testing.T) {
	spec := loop.Spec{Tenant: "alpha", Session: "w0-0", ID: "run_chk", Input: "ask:Which city?|answer:noted", Limits: loop.DefaultLimits,
		ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 8}}
	m1, m2 := loop.ModelEffectID(spec.ID, 1), loop.ModelEffectID(spec.ID, 2)
	model := func(m abi.ModelOutcome) *loop.Outcome {
		m.Message.Role = abi.MessageAssistant
		return &loop.Outcome{State: loop.OutcomeDone, Model: &m}
	}
	ask := model(abi.ModelOutcome{Message: abi.Message{Content: "Which city?"}, AwaitInput: &abi.AwaitInput{Prompt: "Which city?"}})
	input := loop.Event{Type: loop.EventInputProvided, Input: chaosAnswer("Which city?")}
	evs := []loop.Event{
		loop.RunCreated(spec, 1),
		{Type: loop.EventRunStarted},
		{Type: loop.EventModelStepPlanned, Step: 1, Request: []byte(`{}`)},
		{Type: loop.EventEffectDispatched, EffectID: m1, Attempt: 1, Epoch: 1},
		{Type: loop.EventEffectSettled, EffectID: m1, Attempt: 1, Outcome: ask},
		input,
		{Type: loop.EventModelStepPlanned, Step: 2, Request: []byte(`{}`)},
		{Type: loop.EventEffectDispatched, EffectID: m2, Attempt: 1, Epoch: 2},
		{Type: loop.EventEffectSettled, EffectID: m2, Attempt: 1, Outcome: model(abi.ModelOutcome{Message: abi.Message{Content: "noted"}})},
		{Type: loop.EventRunCompleted},
	}
	var run loop.Run
	for i := range evs {
		evs[i].At = int64(i + 1)
		next, err := loop.Apply(run, evs[i])
		if err != nil {
			t.Fatalf("the good log's event %d (%s) is refused: %v", i+1, evs[i].Type, err)
		}
		run = next
		evs[i].Seq = run.Seq
	}
	numbered := func(evs []loop.Event) []loop.Event {
		for i := range evs {
			evs[i].Seq = int64(i + 1)
		}
		return evs
	}
	with := func(i int, ev loop.Event) []loop.Event {
		out := append([]loop.Event(nil), evs...)
		out[i] = ev
		out[i].Seq = int64(i + 1)
		return out
	}
	for _, c := range []struct {
		name string
		evs  []loop.Event
		want string // a fragment of a violation; "" for none
	}{
		{"a Run that ended, its question answered, passes", evs, ""},
		{"an answer to another question is caught", with(5, loop.Event{Type: loop.EventInputProvided, Input: chaosAnswer("Which day?")}), "does not answer the open question"},
		{"a Run that has not ended is caught", evs[:len(evs)-1], "not terminal"},
		{"an attempt settled twice is caught", numbered(append(append(append([]loop.Event(nil), evs[:9]...), evs[8]), evs[9:]...)), "settled twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := chaosCheckLog(c.evs)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case c.want != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), c.want)):
				t.Errorf("violations %q, want one with %q", got, c.want)
			}
		})
	}
}

// TestChaosStreamCheck shows that the bench catches an event stream that
// delivered something other than the store's log, and one that skipped or
// repeated an event.
func TestChaosStreamCheck(t *testing.T) {
	evs := []loop.Event{{Seq: 1, Type: loop.EventRunCreated}, {Seq: 2, Type: loop.EventRunStarted}, {Seq: 3, Type: loop.EventRunCompleted}}
	stream := func(types ...loop.EventType) *runStream { return &runStream{types: types} }
	for _, c := range []struct {
		name string
		st   *runStream
		want string
	}{
		{"the whole log passes", stream(loop.EventRunCreated, loop.EventRunStarted, loop.EventRunCompleted), ""},
		{"a prefix passes", stream(loop.EventRunCreated), ""},
		{"no stream passes", nil, ""},
		{"a missed event is compared with nothing", stream(loop.EventRunCreated, "", loop.EventRunCompleted), ""},
		{"another type is caught", stream(loop.EventRunCreated, loop.EventRunCancelled), "the store holds run_started at 2"},
		{"an event the store lacks is caught", stream(loop.EventRunCreated, loop.EventRunStarted, loop.EventRunCompleted, loop.EventRunCompleted), "has 3 events"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := chaosCheckStream(c.st, evs)
			switch {
			case c.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case c.want != "" && (len(got) == 0 || !strings.Contains(strings.Join(got, "\n"), c.want)):
				t.Errorf("violations %q, want one with %q", got, c.want)
			}
		})
	}

	c := &chaosClients{reported: map[string]bool{}}
	r := ackedRun{Tenant: "alpha", ID: "run_1"}
	st := &runStream{}
	for _, ev := range []sseEvent{{1, loop.EventRunCreated}, {2, loop.EventRunStarted}, {2, loop.EventRunStarted}, {4, loop.EventRunCompleted}} {
		c.gotEvent(r, 1, st, ev)
	}
	if _, v := c.snapshot(); len(v) != 1 || !strings.Contains(v[0], "sent event 2 (run_started) after event 2") {
		t.Errorf("violations %q, want the repeated event 2 reported once", v)
	}
	if want := []loop.EventType{loop.EventRunCreated, loop.EventRunStarted, "", loop.EventRunCompleted}; !st.ended || strings.Join(eventTypes(st.types), ",") != strings.Join(eventTypes(want), ",") {
		t.Errorf("stream %+v, want %v and ended", st, want)
	}
}

func eventTypes(ts []loop.EventType) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

// TestChaosTakeoverTimes shows how the bench reads the takeovers from the
// nodes' logs and times them from each death, in lease TTLs.
func TestChaosTakeoverTimes(t *testing.T) {
	line := `time=2026-12-01T08:00:07.500Z level=INFO msg="recovery: session taken over" node=node-b tenant=alpha session="w1 2" dead_owner=node-a epoch=3`
	for key, want := range map[string]string{"time": "2026-12-01T08:00:07.500Z", "msg": "recovery: session taken over", "node": "node-b", "session": "w1 2", "dead_owner": "node-a", "missing": ""} {
		if got := logAttr(line, key); got != want {
			t.Errorf("logAttr(%s) = %q, want %q", key, got, want)
		}
	}
	began := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return began.Add(time.Duration(s * float64(time.Second))) }
	deaths := []chaosDeath{
		{Node: 0, Kind: faultKill, Owner: "node-a", at: at(1)},
		{Node: 1, Kind: faultPause, Owner: "node-c", at: at(2)},
		{Node: 2, Kind: faultKill, Owner: "node-d", at: at(3)},
	}
	takeovers := []chaosTakeover{
		{at: at(9), taker: "node-b", deadOwner: "node-a", tenant: "alpha", session: "s1"},
		{at: at(11), taker: "node-e", deadOwner: "node-a", tenant: "beta", session: "s2"},
		{at: at(16), taker: "node-b", deadOwner: "node-c", tenant: "alpha", session: "s3"},
		{at: at(4), taker: "node-b", deadOwner: "", tenant: "alpha", session: "s4"},
		{at: at(1), taker: "node-b", deadOwner: "node-x", tenant: "alpha", session: "s5"},
	}
	ids := map[string]int{"node-a": 0, "node-b": 2, "node-c": 1, "node-e": 0}
	rep := chaosTimeTakeovers(deaths, takeovers, ids, 3, 10*time.Second, began)
	kill := rep.Deaths[0]
	if kill.Sessions != 2 || kill.FirstS != 8 || kill.AllS != 10 || kill.FirstTTL != 0.8 || kill.AllTTL != 1 || len(kill.Takers) != 2 {
		t.Errorf("the kill's takeovers: %+v, want 2 sessions, first after 8 s (0.8 TTL), all after 10 s (1 TTL), by nodes 0 and 2", kill)
	}
	if p := rep.Deaths[1]; p.Sessions != 1 || p.FirstTTL != 1.4 {
		t.Errorf("the pause's takeovers: %+v, want 1 session after 1.4 TTL", p)
	}
	if rep.KillsWithout != 1 || rep.Released != 1 || len(rep.Other) != 1 {
		t.Errorf("report %+v: want 1 kill without takeovers, 1 released session, 1 takeover no death explains", rep)
	}
	if a := rep.All; a.Deaths != 2 || a.Kills != 1 || a.PausesPast != 1 || a.Sessions != 3 || a.FirstMax != 1.4 || a.AllMax != 1.4 {
		t.Errorf("all: %+v", a)
	}
	if n := rep.Nodes[0]; n.Kills != 1 || n.Sessions != 2 || n.AllMedian != 1 {
		t.Errorf("node 0: %+v", n)
	}
}
