package runtime_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

var (
	metaSeeds = flag.Int("meta.seeds", 0, "seeds per MemStore configuration (default 50, or $AGENTHOST_META_SEEDS)")
	metaSeed  = flag.Int64("meta.seed", -1, "run only this seed")
)

// metaConfig is one configuration the same seeded sequences run under.
type metaConfig struct {
	name       string
	badger     bool
	pending    bool // tools answer pending (slow) rather than done (echo)
	attachLost bool // attach answers unknown (the executor keeps nothing)
}

func metaSeedCount(badger bool) int {
	n := 50
	if v, err := strconv.Atoi(os.Getenv("AGENTHOST_META_SEEDS")); err == nil && v > 0 {
		n = v
	}
	if *metaSeeds > 0 {
		n = *metaSeeds
	}
	if badger {
		n = max(n/10, 3)
	}
	return n
}

// TestMetamorphic runs seeded sequences of submissions, outcomes,
// approvals, inputs, cancels, timer moves, crashes and recoveries under
// several configurations and checks, at every quiescent point: no effect
// settled twice, every acknowledged Run present, no Run stuck, every
// effect executed within its policy; and at the end, once drained, every
// Run terminal. A failure prints its seed and configuration; rerun one
// with -meta.seed=N. make test runs 4×50 seeds on MemStore and 6 on
// Badger; AGENTHOST_META_SEEDS raises the count.
func TestMetamorphic(t *testing.T) {
	configs := []metaConfig{
		{name: "mem/done/attach-pending"},
		{name: "mem/pending/attach-pending", pending: true},
		{name: "mem/pending/attach-unknown", pending: true, attachLost: true},
		{name: "mem/done/attach-unknown", attachLost: true},
		{name: "badger/pending/attach-pending", badger: true, pending: true},
		{name: "badger/done/attach-unknown", badger: true, attachLost: true},
	}
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			seeds := metaSeedCount(cfg.badger)
			start := time.Now()
			for seed := int64(0); seed < int64(seeds); seed++ {
				if *metaSeed >= 0 && seed != *metaSeed {
					continue
				}
				m := newMeta(t, cfg, seed)
				m.run()
				m.close()
				if t.Failed() {
					t.Fatalf("failed at seed %d under %s; rerun with -run 'TestMetamorphic/%s' -meta.seed=%d", seed, cfg.name, cfg.name, seed)
				}
			}
			t.Logf("%d seeds in %v", seeds, time.Since(start).Round(time.Millisecond))
		})
	}
}

type meta struct {
	t      *testing.T
	cfg    metaConfig
	seed   int64
	rng    *rand.Rand
	clock  *conformance.FakeClock
	store  runtime.Store
	dir    string
	tools  *conformance.ScriptedTools
	counts *conformance.CountingExecutor
	model  *conformance.CountingExecutor
	tenant *runtime.Tenant
	rt     *runtime.Runtime // nil while crashed
	old    []*runtime.Runtime
	nodes  int
	acked  []string // Run IDs whose submission was acknowledged
	log    []string
}

func newMeta(t *testing.T, cfg metaConfig, seed int64) *meta {
	m := &meta{t: t, cfg: cfg, seed: seed, rng: rand.New(rand.NewSource(seed)), clock: conformance.NewFakeClock(time.Time{})}
	m.tools = &conformance.ScriptedTools{SlowPolls: 1, ForgetOnAttach: cfg.attachLost}
	m.counts = &conformance.CountingExecutor{Next: m.tools}
	m.model = &conformance.CountingExecutor{Next: &conformance.ScriptedModel{}}
	m.tenant = &runtime.Tenant{ID: "acme", Builder: &conformance.EchoBuilder{}, Model: m.model,
		Limits:      loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 2},
		ModelPolicy: loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 500}, RunTimeout: time.Hour}
	for _, tl := range m.tools.Tools() {
		spec := loop.ToolSpec{Name: tl.Name, Policy: loop.Policy{Mode: loop.PolicyFail}}
		switch tl.Name {
		case "wire":
			spec.Approval = true
		case "flaky", "slow":
			spec.Policy = loop.Policy{Mode: loop.PolicyRetry, MaxAttempts: 3, BackoffMS: 500}
		}
		m.tenant.Tools = append(m.tenant.Tools, runtime.Tool{Descriptor: tl, Spec: spec, Executor: m.counts})
	}
	if cfg.badger {
		m.dir = t.TempDir()
	}
	m.openStore()
	m.startRuntime()
	return m
}

func (m *meta) openStore() {
	if !m.cfg.badger {
		if m.store == nil {
			m.store = conformance.NewMemStore(m.clock, conformance.KVLimits{})
		}
		return
	}
	s, err := badgerstore.Open(m.dir, badgerstore.Options{Clock: m.clock, Logger: quiet, GCInterval: -1})
	if err != nil {
		m.t.Fatalf("seed %d: reopen: %v", m.seed, err)
	}
	m.store = s
}

func (m *meta) startRuntime() {
	m.nodes++
	rt, err := runtime.New(runtime.Options{Store: m.store, Tenants: runtime.TenantMap{"acme": m.tenant}, Clock: m.clock,
		NodeID: fmt.Sprintf("node-%d", m.nodes), LeaseTTL: time.Minute, PollMin: 200 * time.Millisecond, PollMax: 2 * time.Second,
		MaxDefer: 10 * time.Second, RecoveryInterval: time.Hour, WatchdogInterval: time.Hour, Logger: quiet})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		m.t.Fatalf("seed %d: start: %v", m.seed, err)
	}
	m.rt = rt
	conformance.Eventually(m.t, "recovery's first pass", rt.Ready)
}

func (m *meta) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if m.rt != nil {
		_ = m.rt.Stop(ctx)
	}
	for _, rt := range m.old {
		rt.Halt()
	}
	_ = m.store.Close()
}

var metaScripts = []string{
	"answer:hi",
	`call:echo({"text":"a"}),echo({"text":"b"})|answer:$results`,
	`call:TOOL({"text":"p"})|answer:$results`,
	`call:wire({"text":"w"}),TOOL({"text":"q"})|answer:$results`,
	`ask:which?|call:TOOL({"text":"r"})|answer:$results`,
	`call:flaky()|answer:$results`,
	`call:lost()|answer:$results`,
	`call:fail(),echo({"text":"e"})|answer:$results`,
}

func (m *meta) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf(format, args...))
}

func (m *meta) fatalf(format string, args ...any) {
	m.t.Helper()
	tail := m.log
	if len(tail) > 25 {
		tail = tail[len(tail)-25:]
	}
	m.t.Fatalf("seed %d (%s): %s\nlast steps:\n  %s", m.seed, m.cfg.name, fmt.Sprintf(format, args...), strings.Join(tail, "\n  "))
}

// run plays one seeded sequence, then drains it.
func (m *meta) run() {
	ctx := context.Background()
	steps := 20 + m.rng.Intn(20)
	for i := 0; i < steps; i++ {
		switch op := m.rng.Intn(100); {
		case m.rt == nil:
			m.recover()
		case op < 30:
			tool := "echo"
			if m.cfg.pending {
				tool = "slow"
			}
			script := strings.ReplaceAll(metaScripts[m.rng.Intn(len(metaScripts))], "TOOL", tool)
			session := fmt.Sprintf("s%d", m.rng.Intn(3))
			run, _, err := m.rt.Submit(ctx, runtime.Request{Tenant: "acme", Session: session, Input: script})
			m.logf("submit %s %q -> %s %v", session, script, run.ID, err)
			if err == nil {
				m.acked = append(m.acked, run.ID)
			}
		case op < 50:
			d := time.Duration(m.rng.Intn(3000)) * time.Millisecond
			m.logf("advance %v", d)
			m.clock.Advance(d)
		case op < 62:
			m.answerSomeone(ctx)
		case op < 68:
			if id := m.someRun(); id != "" {
				_, err := m.rt.Cancel(ctx, "acme", id, "metamorphic cancel")
				m.logf("cancel %s -> %v", id, err)
			}
		case op < 76:
			m.crash()
		default:
			m.clock.Advance(200 * time.Millisecond)
			m.logf("tick")
		}
		m.quiesce()
		m.check(false)
	}
	m.drain()
	m.check(true)
}

func (m *meta) someRun() string {
	if len(m.acked) == 0 {
		return ""
	}
	return m.acked[m.rng.Intn(len(m.acked))]
}

// answerSomeone approves or denies a gated call, or answers a question, of
// a waiting Run.
func (m *meta) answerSomeone(ctx context.Context) {
	id := m.someRun()
	if id == "" {
		return
	}
	run, err := m.store.LoadRun(ctx, "acme", id)
	if err != nil || run.Status.Terminal() {
		return
	}
	w := runtime.WaitingFor(run)
	switch {
	case len(w.Approvals) > 0:
		ok := m.rng.Intn(3) > 0
		_, err := m.rt.Approve(ctx, "acme", id, []abi.ApprovalDecision{{ToolCallID: w.Approvals[0], Approved: ok, Reason: "meta"}})
		m.logf("approve %s %s=%v -> %v", id, w.Approvals[0], ok, err)
	case w.Input != nil:
		_, err := m.rt.ProvideInput(ctx, "acme", id, "yes")
		m.logf("input %s -> %v", id, err)
	}
}

// crash halts the runtime as a crash would and reopens the store (Badger)
// or declares every earlier incarnation dead (MemStore), as a restart does.
func (m *meta) crash() {
	m.logf("crash node-%d", m.nodes)
	m.rt.Halt()
	m.waitIdle(m.rt)
	m.old = append(m.old, m.rt)
	m.rt = nil
	if m.cfg.badger {
		if err := m.store.Close(); err != nil {
			m.fatalf("close: %v", err)
		}
		m.openStore()
	} else {
		m.store.(*conformance.MemStore).Restart()
	}
}

func (m *meta) recover() {
	m.startRuntime()
	m.logf("recover as node-%d", m.nodes)
}

func (m *meta) waitIdle(rt *runtime.Runtime) {
	deadline := time.Now().Add(20 * time.Second)
	for !(rt.Idle() && m.clock.Running() == 0) {
		if time.Now().After(deadline) {
			m.fatalf("runtime not idle after 20s")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (m *meta) quiesce() {
	if m.rt != nil {
		m.waitIdle(m.rt)
	}
	for _, rt := range m.old {
		m.waitIdle(rt)
	}
}

// drain recovers, answers every person-wait, and moves time until every
// Run is terminal.
func (m *meta) drain() {
	ctx := context.Background()
	if m.rt == nil {
		m.recover()
	}
	for round := 0; ; round++ {
		m.quiesce()
		open := 0
		for _, id := range m.acked {
			run, err := m.store.LoadRun(ctx, "acme", id)
			if err != nil {
				m.fatalf("acknowledged run %s: %v", id, err)
			}
			if run.Status.Terminal() {
				continue
			}
			open++
			w := runtime.WaitingFor(run)
			if len(w.Approvals) > 0 {
				_, _ = m.rt.Approve(ctx, "acme", id, []abi.ApprovalDecision{{ToolCallID: w.Approvals[0], Approved: true}})
			}
			if w.Input != nil {
				_, _ = m.rt.ProvideInput(ctx, "acme", id, "drained")
			}
		}
		if open == 0 {
			return
		}
		if round > 400 {
			m.fatalf("%d runs not terminal after draining", open)
		}
		m.clock.Advance(500 * time.Millisecond)
	}
}

// check verifies the invariants over every acknowledged Run.
func (m *meta) check(drained bool) {
	ctx := context.Background()
	for _, id := range m.acked {
		run, err := m.store.LoadRun(ctx, "acme", id)
		if err != nil {
			m.fatalf("acknowledged run %s is missing: %v", id, err)
		}
		evs, err := m.store.Events(ctx, "acme", id, 1, 0)
		if err != nil {
			m.fatalf("events of %s: %v", id, err)
		}
		settled := map[string]int{}
		attempts := map[string]int{}
		for _, ev := range evs {
			switch ev.Type {
			case loop.EventEffectSettled:
				k := loop.SettleCommandID(ev.EffectID, ev.Attempt)
				if settled[k]++; settled[k] > 1 {
					m.fatalf("%s settled twice", k)
				}
			case loop.EventEffectDispatched:
				attempts[ev.EffectID] = max(attempts[ev.EffectID], ev.Attempt)
			}
		}
		// Executions within policy: no attempt started twice, and no more
		// attempts than the policy allows.
		for eff, n := range attempts {
			ref, _ := loop.ParseEffectID(eff)
			maxAttempts := 1
			var p loop.Policy
			if ref.Kind == "model" {
				p = run.ModelPolicy
			} else if e := toolOf(evs, run, eff); e != "" {
				s, _ := run.ToolSpec(e)
				p = s.Policy
			}
			if p.Mode == loop.PolicyRetry {
				maxAttempts = p.MaxAttempts
			}
			if n > maxAttempts {
				m.fatalf("%s dispatched %d attempts; its policy allows %d", eff, n, maxAttempts)
			}
			for a := 1; a <= n; a++ {
				key := loop.AssignmentKey{Tenant: "acme", Session: run.Session, EffectID: eff, Attempt: a}.String()
				starts := m.counts.CallsFor(abi.ExportStart, key) + m.model.CallsFor(abi.ExportStart, key)
				if starts > 1 {
					m.fatalf("%s started %d times", key, starts)
				}
			}
		}
		if drained && !run.Status.Terminal() {
			m.fatalf("run %s is %s after draining", id, run.Status)
		}
		// No Run stuck: at a quiescent point with a live runtime, a
		// non-terminal Run has something in flight, awaited, timed, or is
		// queued behind its session's head.
		if m.rt != nil && !run.Status.Terminal() && !run.InFlight() {
			w := runtime.WaitingFor(run)
			if len(w.Approvals) == 0 && w.Input == nil && !w.Queued && !hasEffectTimer(run) {
				m.fatalf("run %s is stuck: %s, effects %+v", id, run.Status, run.Effects)
			}
		}
	}
}

// toolOf finds the tool of a tool effect from the Run's effects or the
// assistant messages of its transcript.
func toolOf(evs []loop.Event, run loop.Run, effectID string) string {
	if e := run.Effect(effectID); e != nil {
		return e.Tool
	}
	ref, _ := loop.ParseEffectID(effectID)
	step := 0
	for _, msg := range run.Transcript {
		if msg.Role == abi.MessageAssistant {
			step++
			if step == ref.Step && ref.Index < len(msg.ToolCalls) {
				return msg.ToolCalls[ref.Index].Name
			}
		}
	}
	return ""
}

func hasEffectTimer(run loop.Run) bool {
	for _, a := range loop.Decide(run) {
		if a.Type == loop.ActionWakeAt && a.EffectID != "" {
			return true
		}
	}
	return false
}
