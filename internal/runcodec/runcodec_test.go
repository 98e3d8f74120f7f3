package runcodec

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// fill sets every exported field reachable from v to a value drawn from
// rng: strings, numbers and booleans that are not zero, pointers set,
// slices of one to three elements, raw JSON that is valid. A field the
// codec forgets decodes as its zero value, so the round trip catches it.
func fill(rng *rand.Rand, v reflect.Value, depth int) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d-é\x00\"<>", rng.IntN(1000)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		n := rng.Int64N(1<<40) + 1
		if rng.IntN(2) == 0 {
			n = -n
		}
		v.SetInt(n)
	case reflect.Uint64, reflect.Uint32, reflect.Uint:
		v.SetUint(rng.Uint64() | 1)
	case reflect.Pointer:
		if depth > 6 {
			return
		}
		p := reflect.New(v.Type().Elem())
		fill(rng, p.Elem(), depth+1)
		v.Set(p)
	case reflect.Slice:
		if v.Type() == reflect.TypeOf(json.RawMessage(nil)) {
			v.SetBytes([]byte(fmt.Sprintf(`{"k":%d,"s":"x y"}`, rng.IntN(100))))
			return
		}
		if depth > 6 {
			return
		}
		n := 1 + rng.IntN(3)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := 0; i < n; i++ {
			fill(rng, s.Index(i), depth+1)
		}
		v.Set(s)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				fill(rng, v.Field(i), depth+1)
			}
		}
	default:
		panic(fmt.Sprintf("fill: unhandled kind %s (%s): teach the test, and the codec, the new field", v.Kind(), v.Type()))
	}
}

// TestEveryFieldRoundTrips fills every field of a Run and requires the
// decoded Run to be deeply equal: a field added to loop.Run, or to any type
// it holds, that the codec does not carry fails here.
func TestEveryFieldRoundTrips(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200; i++ {
		var r loop.Run
		fill(rng, reflect.ValueOf(&r).Elem(), 0)
		b := Append(nil, &r)
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if !reflect.DeepEqual(got, r) {
			gj, _ := json.Marshal(got)
			rj, _ := json.Marshal(r)
			t.Fatalf("round trip differs:\n got  %s\n want %s", gj, rj)
		}
	}
}

// TestNilAndEmptyStayApart: a nil slice and an empty one decode as they
// were, so the snapshot's JSON (null against []) is the same either way.
func TestNilAndEmptyStayApart(t *testing.T) {
	for _, r := range []loop.Run{
		{},
		{Transcript: []abi.Message{}, Effects: []loop.Effect{}, Spec: loop.Spec{Tools: []loop.ToolSpec{}, Metadata: json.RawMessage{}}},
		{Transcript: []abi.Message{{ToolCalls: []abi.ToolCall{}}}, Effects: []loop.Effect{{Arguments: json.RawMessage{}}}},
	} {
		got, err := Decode(Append(nil, &r))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Fatalf("got %#v, want %#v", got, r)
		}
		gj, _ := json.Marshal(got)
		rj, _ := json.Marshal(r)
		if string(gj) != string(rj) {
			t.Fatalf("JSON differs: %s against %s", gj, rj)
		}
	}
}

// TestScenarioSnapshotsDecideAlike runs the Loop over the scripted
// scenarios' kind of Runs (tool calls, approvals, failures, a verdict) and
// checks, at every snapshot, that the decoded Run decides the same Actions
// and marshals to the same JSON.
func TestScenarioSnapshotsDecideAlike(t *testing.T) {
	run := loop.Run{}
	spec := loop.Spec{Tenant: "t", Session: "s", ID: "r1", Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Tools: []loop.ToolSpec{{Name: "calc", Policy: loop.DefaultToolPolicy(false)}, {Name: "ok", Approval: true, Policy: loop.DefaultToolPolicy(true)}}}
	events := []loop.Event{
		{Type: loop.EventRunCreated, Spec: &spec, At: 1},
		{Type: loop.EventRunStarted, At: 2},
		{Type: loop.EventModelStepPlanned, Step: 1, Request: json.RawMessage(`{"messages":[]}`), At: 3},
		{Type: loop.EventEffectDispatched, EffectID: loop.ModelEffectID("r1", 1), Attempt: 1, Epoch: 7, At: 4},
		{Type: loop.EventEffectSettled, EffectID: loop.ModelEffectID("r1", 1), Attempt: 1, At: 5, Outcome: &loop.Outcome{State: loop.OutcomeDone,
			Model: &abi.ModelOutcome{Message: abi.Message{Role: "assistant", ToolCalls: []abi.ToolCall{
				{ID: "c1", Name: "calc", Arguments: json.RawMessage(`{"e":"1+1"}`)}, {ID: "c2", Name: "ok"}, {ID: "c3", Name: "nope"}}},
				Usage: abi.Usage{InputTokens: 10, OutputTokens: 3}}}},
	}
	check := func(r loop.Run) {
		t.Helper()
		got, err := Decode(Append(nil, &r))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(loop.Decide(got), loop.Decide(r)) {
			t.Fatalf("at seq %d the decoded Run decides otherwise", r.Seq)
		}
		gj, _ := json.Marshal(got)
		rj, _ := json.Marshal(r)
		if string(gj) != string(rj) {
			t.Fatalf("at seq %d JSON differs:\n%s\n%s", r.Seq, gj, rj)
		}
	}
	for i, ev := range events {
		ev.Seq = int64(i + 1)
		next, err := loop.Apply(run, ev)
		if err != nil {
			t.Fatalf("apply %s: %v", ev.Type, err)
		}
		run = next
		check(run)
	}
	// Dispatch what Decide asks for, settle it, and go on until the Run
	// waits or ends, checking every snapshot.
	for guard := 0; guard < 50 && !run.Status.Terminal(); guard++ {
		acts := loop.Decide(run)
		var ev *loop.Event
		for _, a := range acts {
			switch a.Type {
			case loop.ActionDispatch:
				ev = &loop.Event{Type: loop.EventEffectDispatched, EffectID: a.EffectID, Attempt: a.Attempt, Epoch: 7}
			case loop.ActionAwaitApproval:
				ev = &loop.Event{Type: loop.EventApprovalRecorded, Approvals: []abi.ApprovalDecision{{ToolCallID: "c2", Approved: false, Reason: "no"}}}
			case loop.ActionComplete:
				ev = &loop.Event{Type: loop.EventRunCompleted, Result: a.Result}
			case loop.ActionFail:
				ev = &loop.Event{Type: loop.EventRunFailed, Failure: a.Failure}
			case loop.ActionPlanModelStep:
				ev = &loop.Event{Type: loop.EventModelStepPlanned, Step: a.Step, Request: json.RawMessage(`{}`)}
			}
			if ev != nil {
				break
			}
		}
		if ev == nil {
			for _, e := range run.Effects {
				if e.State == loop.EffectExecuting {
					o := &loop.Outcome{State: loop.OutcomeFailed, Error: &loop.Failure{Class: abi.ClassPluginFailed, Message: "boom"}}
					if e.Kind == abi.KindModel {
						o = &loop.Outcome{State: loop.OutcomeDone, Model: &abi.ModelOutcome{Message: abi.Message{Role: "assistant", Content: "done"}}}
					}
					ev = &loop.Event{Type: loop.EventEffectSettled, EffectID: e.ID, Attempt: e.Attempt, Outcome: o}
					break
				}
			}
		}
		if ev == nil {
			break
		}
		ev.Seq, ev.At = run.Seq+1, run.UpdatedAt+1
		next, err := loop.Apply(run, *ev)
		if err != nil {
			t.Fatalf("apply %s: %v", ev.Type, err)
		}
		run = next
		check(run)
	}
	if !run.Status.Terminal() {
		t.Fatalf("the scenario did not end: %s", run.Status)
	}
}

// version1Snapshot is a freshly created Run (two tools, one with an input
// schema) as the codec wrote it in version 1, before tools carried their
// descriptors: the bytes a store written then holds.
const version1Snapshot = "010461636d650273310272310b63616c6c3a6563686f282900202008000005726574727906d00fe0d40303046563686f00" +
	"05726574727906d00fe0d403127b2274797065223a226f626a656374227d047769726501046661696c000000000770656e64696e670280a0abfef962" +
	"80a0abfef962000204757365720b63616c6c3a6563686f282900000000000000000000"

// TestAVersion1SnapshotStillDecodes: a snapshot stored before descriptors
// were pinned decodes as the same Run with no descriptors (the runtime
// then offers the tenant's current descriptors of the Run's own tools),
// and is written again in the current version.
func TestAVersion1SnapshotStillDecodes(t *testing.T) {
	b, err := hex.DecodeString(version1Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	spec := loop.Spec{Tenant: "acme", Session: "s1", ID: "r1", Input: "call:echo()", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Tools: []loop.ToolSpec{
			{Name: "echo", Policy: loop.DefaultToolPolicy(true), InputSchema: json.RawMessage(`{"type":"object"}`)},
			{Name: "wire", Approval: true, Policy: loop.DefaultToolPolicy(false)},
		}}
	want, err := loop.Apply(loop.Run{}, loop.Event{Type: loop.EventRunCreated, Spec: &spec, Seq: 1, At: 1700000000000})
	if err != nil {
		t.Fatal(err)
	}
	if !IsBinary(b) {
		t.Fatal("a version-1 snapshot is not taken for the binary form")
	}
	for _, decode := range []func([]byte) (loop.Run, error){Decode, Unmarshal} {
		got, err := decode(b)
		if err != nil {
			t.Fatalf("decode a version-1 snapshot: %v", err)
		}
		if !reflect.DeepEqual(got, want) {
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			t.Fatalf("a version-1 snapshot decodes as\n %s\nwant\n %s", gj, wj)
		}
	}
	again := Append(nil, &want)
	if again[0] != Current {
		t.Fatalf("Append writes version %#x, want %#x", again[0], Current)
	}
	if got, err := Decode(again); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("rewritten in version %d: %+v, %v", Current, got, err)
	}
}

// version2Snapshot is a freshly created Run (one tool, with its pinned
// descriptor) as the codec wrote it in version 2, before Runs carried
// their agent: the bytes a store written then holds.
const version2Snapshot = "020461636d650273310272310b63616c6c3a6563686f282900202008000005726574727906d00fe0d40302046563686f00" +
	"05726574727906d00fe0d403127b2274797065223a226f626a656374227d01046563686f044563686f127b2274797065223a226f626a656374227d01" +
	"056e657665720770656e64696e670280a0abfef96280a0abfef962000204757365720b63616c6c3a6563686f282900000000000000000000"

// TestAVersion2SnapshotStillDecodes: a snapshot stored before Runs were
// pinned to their agent decodes as the same Run with no agent (the
// runtime then runs it as its tenant's default agent), and is written
// again in the current version, agent and all.
func TestAVersion2SnapshotStillDecodes(t *testing.T) {
	b, err := hex.DecodeString(version2Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	schema := json.RawMessage(`{"type":"object"}`)
	spec := loop.Spec{Tenant: "acme", Session: "s1", ID: "r1", Input: "call:echo()", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Tools: []loop.ToolSpec{{Name: "echo", Policy: loop.DefaultToolPolicy(true), InputSchema: schema,
			Descriptor: &abi.Tool{Name: "echo", Description: "Echo", InputSchema: schema, Idempotent: true, Approval: abi.ApprovalNever}}}}
	want, err := loop.Apply(loop.Run{}, loop.Event{Type: loop.EventRunCreated, Spec: &spec, Seq: 1, At: 1700000000000})
	if err != nil {
		t.Fatal(err)
	}
	if !IsBinary(b) {
		t.Fatal("a version-2 snapshot is not taken for the binary form")
	}
	for _, decode := range []func([]byte) (loop.Run, error){Decode, Unmarshal} {
		got, err := decode(b)
		if err != nil {
			t.Fatalf("decode a version-2 snapshot: %v", err)
		}
		if got.Agent != nil {
			t.Fatalf("a version-2 snapshot decodes with agent %+v; it has none", got.Agent)
		}
		if !reflect.DeepEqual(got, want) {
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			t.Fatalf("a version-2 snapshot decodes as\n %s\nwant\n %s", gj, wj)
		}
	}
	pinned := want
	pinned.Agent = &loop.AgentPin{Name: "support", Version: "v-0123456789ab", Instructions: "Be brief.", Settings: json.RawMessage(`{"model":"m","temperature":0.2}`)}
	again := Append(nil, &pinned)
	if again[0] != Current {
		t.Fatalf("Append writes version %#x, want %#x", again[0], Current)
	}
	if got, err := Decode(again); err != nil || !reflect.DeepEqual(got, pinned) {
		t.Fatalf("rewritten in version %d: %+v, %v", Current, got, err)
	}
}

// version3Snapshot is a freshly created Run of agent "support" (one tool,
// with its pinned descriptor) as the codec wrote it in version 3, before
// agents could be tools of other agents: the bytes a store written then
// holds.
const version3Snapshot = "030461636d650273310272310b63616c6c3a6563686f282900202008000005726574727906d00fe0d40302046563686f00" +
	"05726574727906d00fe0d403127b2274797065223a226f626a656374227d01046563686f044563686f127b2274797065223a226f626a656374227d01" +
	"056e657665720107737570706f72740e762d3031323334353637383961620942652062726965662e0e7b226d6f64656c223a226d227d0770656e64" +
	"696e670280a0abfef96280a0abfef962000204757365720b63616c6c3a6563686f282900000000000000000000"

// TestAVersion3SnapshotStillDecodes: a snapshot stored before agents could
// be tools decodes as the same Run, with no agent tools, parent,
// children, output schema or wait clocks, and is written again in the
// current version with all of them.
func TestAVersion3SnapshotStillDecodes(t *testing.T) {
	b, err := hex.DecodeString(version3Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	schema := json.RawMessage(`{"type":"object"}`)
	spec := loop.Spec{Tenant: "acme", Session: "s1", ID: "r1", Input: "call:echo()", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Tools: []loop.ToolSpec{{Name: "echo", Policy: loop.DefaultToolPolicy(true), InputSchema: schema,
			Descriptor: &abi.Tool{Name: "echo", Description: "Echo", InputSchema: schema, Idempotent: true, Approval: abi.ApprovalNever}}},
		Agent: &loop.AgentPin{Name: "support", Version: "v-0123456789ab", Instructions: "Be brief.", Settings: json.RawMessage(`{"model":"m"}`)}}
	want, err := loop.Apply(loop.Run{}, loop.Event{Type: loop.EventRunCreated, Spec: &spec, Seq: 1, At: 1700000000000})
	if err != nil {
		t.Fatal(err)
	}
	for _, decode := range []func([]byte) (loop.Run, error){Decode, Unmarshal} {
		got, err := decode(b)
		if err != nil {
			t.Fatalf("decode a version-3 snapshot: %v", err)
		}
		if !reflect.DeepEqual(got, want) {
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			t.Fatalf("a version-3 snapshot decodes as\n %s\nwant\n %s", gj, wj)
		}
	}
	child := want
	child.Tools = append([]loop.ToolSpec(nil), want.Tools...)
	child.Tools[0].Agent = "research"
	child.Parent = &loop.ParentRef{Run: "p1", Session: "s0", Effect: "p1.t1.0", Attempt: 1, ToolCallID: "call_1", Depth: 1}
	child.Children = []loop.ChildRef{{Run: loop.ChildRunID("r1.t1.0", 1), Agent: "research", Effect: "r1.t1.0", Attempt: 1}}
	pin := *want.Agent
	pin.OutputSchema = json.RawMessage(`{"type":"object","required":["city"]}`)
	child.Agent = &pin
	child.Limits.RunTimeoutMS, child.Limits.WaitTimeoutMS = 60_000, 3_600_000
	child.WaitingSince, child.WaitedMS = 1700000005000, 1200
	again := Append(nil, &child)
	if again[0] != Current {
		t.Fatalf("Append writes version %#x, want %#x", again[0], Current)
	}
	if got, err := Decode(again); err != nil || !reflect.DeepEqual(got, child) {
		t.Fatalf("rewritten in version %d: %+v, %v", Current, got, err)
	}
}

// version4Snapshot is a Run whose model step failed once, retriably,
// and backs off, as the codec wrote it in version 4, before policies had
// rate-limit parameters and failures a retry_after: the bytes a store
// written then holds.
const version4Snapshot = "040461636d6502733102723102686900202008000005726574727906d00fe0d40302046563686f0005726574727906d00fe0d4030000000772756e6e" +
	"696e670a80a0abfef96288a0abfef96202020475736572026869000000020572312e6d31056d6f64656c020000000006076261636b6f666602030086" +
	"a0abfef962f8b2abfef96201066661696c65640000010d706c7567696e5f6661696c6564177468652073657276657220616e73776572656420343239" +
	"0102000000000000000000000000000000"

// version4Events are the events that made version4Snapshot's Run.
func version4Events() []loop.Event {
	spec := loop.Spec{Tenant: "acme", Session: "s1", ID: "r1", Input: "hi", Limits: loop.DefaultLimits, ModelPolicy: loop.DefaultModelPolicy,
		Tools: []loop.ToolSpec{{Name: "echo", Policy: loop.DefaultToolPolicy(true)}}}
	return []loop.Event{
		{Type: loop.EventRunCreated, Spec: &spec, At: 1700000000000},
		{Type: loop.EventRunStarted, At: 1700000000001},
		{Type: loop.EventModelStepPlanned, Step: 1, Request: json.RawMessage(`{"messages":[]}`), At: 1700000000002},
		{Type: loop.EventEffectDispatched, EffectID: "r1.m1", Attempt: 1, Epoch: 3, At: 1700000000003},
		loop.Settled("r1.m1", 1, loop.Outcome{State: loop.OutcomeFailed, Error: &loop.Failure{Class: abi.ClassPluginFailed,
			Message: "the server answered 429", Retriable: true}}, 1700000000004),
	}
}

// TestAVersion4SnapshotStillDecodes: a snapshot stored before rate limits
// were told apart decodes as the same Run, with no rate-limit parameters
// (its policies take the Loop's defaults), no rate-limited attempts and
// no retry_after, decides the same, and is written again in the current
// version with all of them.
func TestAVersion4SnapshotStillDecodes(t *testing.T) {
	b, err := hex.DecodeString(version4Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	var want loop.Run
	for i, ev := range version4Events() {
		ev.Seq = int64(i + 1)
		if want, err = loop.Apply(want, ev); err != nil {
			t.Fatal(err)
		}
	}
	for _, decode := range []func([]byte) (loop.Run, error){Decode, Unmarshal} {
		got, err := decode(b)
		if err != nil {
			t.Fatalf("decode a version-4 snapshot: %v", err)
		}
		if !reflect.DeepEqual(got, want) {
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(want)
			t.Fatalf("a version-4 snapshot decodes as\n %s\nwant\n %s", gj, wj)
		}
		if !reflect.DeepEqual(loop.Decide(got), loop.Decide(want)) {
			t.Fatal("the decoded version-4 snapshot decides otherwise")
		}
	}
	limited := want.Clone()
	limited.ModelPolicy.MaxRateLimitedAttempts, limited.ModelPolicy.MaxRetryAfterMS = 30, 600_000
	limited.Tools = []loop.ToolSpec{want.Tools[0]}
	limited.Tools[0].Policy.MaxRateLimitedAttempts, limited.Tools[0].Policy.MaxRetryAfterMS = 5, 60_000
	e := &limited.Effects[0]
	e.RateLimited = 1
	e.Outcome = &loop.Outcome{State: loop.OutcomeFailed, Error: &loop.Failure{Class: abi.ClassRateLimited, Message: "429", Retriable: true, RetryAfterMS: 20_000}}
	limited.Verdict = &loop.Verdict{Status: loop.StatusFailed, Failure: &loop.Failure{Class: abi.ClassRateLimited, Message: "gave up", RetryAfterMS: 7}}
	limited.Failure = &loop.Failure{Class: abi.ClassRateLimited, Message: "gave up", RetryAfterMS: 9}
	again := Append(nil, &limited)
	if again[0] != Current {
		t.Fatalf("Append writes version %#x, want %#x", again[0], Current)
	}
	if got, err := Decode(again); err != nil || !reflect.DeepEqual(got, limited) {
		gj, _ := json.Marshal(got)
		wj, _ := json.Marshal(limited)
		t.Fatalf("rewritten in version %d: %v\n %s\nwant\n %s", Current, err, gj, wj)
	}
}

// TestMalformedIsAnError cuts and corrupts a real encoding at every byte:
// Decode returns an error or a Run, and never panics.
func TestMalformedIsAnError(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var r loop.Run
	fill(rng, reflect.ValueOf(&r).Elem(), 0)
	b := Append(nil, &r)
	for i := 0; i < len(b); i++ {
		if _, err := Decode(b[:i]); err == nil {
			t.Fatalf("a snapshot cut to %d of %d bytes decoded", i, len(b))
		}
		c := append([]byte(nil), b...)
		c[i] ^= 0xff
		_, _ = Decode(c)
	}
	if _, err := Decode(append(b, 0)); err == nil {
		t.Fatal("a trailing byte was accepted")
	}
	if _, err := Decode([]byte(`{"id":"x"}`)); err == nil {
		t.Fatal("JSON was taken for the binary form")
	}
}

func FuzzDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	var r loop.Run
	fill(rng, reflect.ValueOf(&r).Elem(), 0)
	f.Add(Append(nil, &r))
	f.Add(Append(nil, &loop.Run{}))
	f.Add([]byte{Version1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	if v1, err := hex.DecodeString(version1Snapshot); err == nil {
		f.Add(v1)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Decode(b)
		if err != nil {
			return
		}
		// Whatever decodes round-trips (the bytes may differ: a varint
		// has more than one spelling).
		again, err := Decode(Append(nil, &got))
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Fatalf("a decoded Run does not round-trip: %v", err)
		}
	})
}

// BenchmarkDecode compares the two forms of the same snapshot.
func BenchmarkDecode(b *testing.B) {
	rng := rand.New(rand.NewPCG(7, 8))
	var r loop.Run
	fill(rng, reflect.ValueOf(&r).Elem(), 0)
	bin := Append(nil, &r)
	js, _ := json.Marshal(r)
	b.Run("binary", func(b *testing.B) {
		b.SetBytes(int64(len(bin)))
		for b.Loop() {
			if _, err := Decode(bin); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json", func(b *testing.B) {
		b.SetBytes(int64(len(js)))
		for b.Loop() {
			var out loop.Run
			if err := json.Unmarshal(js, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode-binary", func(b *testing.B) {
		buf := make([]byte, 0, len(bin))
		for b.Loop() {
			buf = Append(buf[:0], &r)
		}
	})
	b.Run("encode-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestAVersion6SnapshotStillDecodes reads a snapshot written before the
// Run's trace context was stored: version 6 is version 7 without its last
// field, so a Run with no trace context, written in version 7 less that
// field's one byte and marked version 6, is one. It decodes as the same
// Run, and one with a trace context is written and read in version 7.
func TestAVersion6SnapshotStillDecodes(t *testing.T) {
	var want loop.Run
	var err error
	for i, ev := range version4Events() {
		ev.Seq = int64(i + 1)
		if want, err = loop.Apply(want, ev); err != nil {
			t.Fatal(err)
		}
	}
	b := Append(nil, &want)
	if b[len(b)-1] != 0 {
		t.Fatalf("an empty trace context is written as %#x, want one zero byte", b[len(b)-1])
	}
	v6 := append([]byte{Version6}, b[1:len(b)-1]...)
	got, err := Decode(v6)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("a version-6 snapshot decodes as %+v, %v", got, err)
	}
	traced := want.Clone()
	traced.TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	again := Append(nil, &traced)
	if again[0] != Version7 {
		t.Fatalf("Append writes version %#x, want %#x", again[0], Version7)
	}
	if got, err := Decode(again); err != nil || got.TraceParent != traced.TraceParent {
		t.Fatalf("the trace context comes back as %q, %v", got.TraceParent, err)
	}
}
