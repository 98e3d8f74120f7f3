package chaos

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// TestChaosChecks shows that the chaos harness holds each Run's log to
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

// TestChaosStreamCheck shows that the harness catches an event stream that
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

// TestChaosTakeoverTimes shows how the harness reads the takeovers from the
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
	deaths := []Death{
		{Node: 0, Kind: FaultKill, Owner: "node-a", at: at(1)},
		{Node: 1, Kind: FaultPause, Owner: "node-c", at: at(2)},
		{Node: 2, Kind: FaultKill, Owner: "node-d", at: at(3)},
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

// TestOptionsCheck shows which faults each store takes by default (in the
// order the seeded first faults are shuffled from, which a seed's replay
// depends on), and that Check refuses, saying why, the options a run
// cannot do.
func TestOptionsCheck(t *testing.T) {
	for _, c := range []struct{ store, dsn, want string }{
		{config.DriverBadger, "", "kill,pause,term"},
		{config.DriverPostgres, "", "kill,pause,term,partition,pgrestart"},
		{config.DriverPostgres, "host=db dbname=scratch", "kill,pause,term,partition"},
	} {
		if got := DefaultFaults(c.store, c.dsn); got.String() != c.want {
			t.Errorf("DefaultFaults(%s, %q) = %s, want %s", c.store, c.dsn, &got, c.want)
		}
	}

	valid := func(store, dsn string) Options {
		return Options{Store: store, DSN: dsn, Concurrency: 1, Nodes: 1, Faults: DefaultFaults(store, dsn)}
	}
	for _, o := range []Options{valid(config.DriverBadger, ""), valid(config.DriverPostgres, ""), valid(config.DriverPostgres, "host=db dbname=scratch")} {
		if err := o.Check(); err != nil {
			t.Errorf("Check(%+v): %v", o, err)
		}
	}
	for _, c := range []struct {
		name   string
		change func(*Options)
		store  string
		want   string
	}{
		{"an unknown store", func(o *Options) { o.Store = "sqlite" }, config.DriverBadger, `--store "sqlite": want badger or postgres`},
		{"no client", func(o *Options) { o.Concurrency = 0 }, config.DriverBadger, "--concurrency must be at least 1"},
		{"no node", func(o *Options) { o.Nodes = 0 }, config.DriverBadger, "--nodes must be at least 1"},
		{"several nodes on Badger", func(o *Options) { o.Nodes = 3 }, config.DriverBadger, "--nodes 3 needs --store postgres"},
		{"a DSN for Badger", func(o *Options) { o.DSN = "host=db" }, config.DriverBadger, "--dsn is for --store postgres"},
		{"a share of long pauses past 1", func(o *Options) { o.LongPauses = 1.5 }, config.DriverPostgres, "--long-pauses 1.5: want a share between 0 and 1"},
		{"a lease serve refuses", func(o *Options) { o.LeaseTTL = time.Millisecond }, config.DriverPostgres, "--lease-ttl 1ms: serve takes no lease shorter than"},
		{"no fault", func(o *Options) { o.Faults = nil }, config.DriverBadger, "--faults must name at least one"},
		{"a partition on Badger", func(o *Options) { o.Faults = FaultKinds{FaultPartition} }, config.DriverBadger, "the partition fault cuts a node off from PostgreSQL: it needs --store postgres"},
		{"pgrestart on Badger", func(o *Options) { o.Faults = FaultKinds{FaultPgRestart} }, config.DriverBadger, "the pgrestart fault restarts PostgreSQL: it needs --store postgres"},
		{"pgrestart on a server of the caller's", func(o *Options) { o.DSN = "host=db"; o.Faults = FaultKinds{FaultPgRestart} }, config.DriverPostgres, "the pgrestart fault is unavailable with --dsn"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := valid(c.store, "")
			c.change(&o)
			err := o.Check()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check(%+v) = %v, want an error with %q", o, err, c.want)
			}
		})
	}
}

// A node's log is read for what it reports: recovery decisions, takeovers,
// watchdog reports (each quoted, the first three, so that a run whose work
// dir a test removed still says which Run was stuck) and panics.
func TestChaosReadLogQuotesWatchdogReports(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serve.log")
	stuck := `time=2026-12-03T17:52:40Z level=ERROR msg="watchdog: run is stuck: not terminal, nothing in flight, nothing awaited, no timer; driving it again" tenant=alpha session=s7 run=run_x status=running seq=9`
	lines := []string{
		`time=2026-12-03T17:52:30Z level=INFO msg="recovery decision" decision=attach effect=run_a.t1.0`,
		`time=2026-12-03T17:52:31Z level=INFO msg="recovery: session taken over" tenant=alpha session=s1`,
		stuck, stuck, stuck, stuck,
		"panic: boom",
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := &Result{Recovery: map[string]int{}}
	got := chaosReadLog(path, res)
	if res.Watchdog != 4 || res.SessionsTaken != 1 || res.Recovery["attach"] != 1 {
		t.Errorf("counted %d watchdog reports, %d takeovers, recovery %v; want 4, 1, attach 1", res.Watchdog, res.SessionsTaken, res.Recovery)
	}
	want := []string{"a watchdog report in " + path + ": " + stuck, "a watchdog report in " + path + ": " + stuck,
		"a watchdog report in " + path + ": " + stuck, "the server log has a Go panic: boom"}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
