package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/host"
	"github.com/agenthost/agenthost/plugins/abi"
)

const slowJobC = "slow-job-c"

// The C slow-job passes the Go build's own test.
func TestSlowJobC(t *testing.T) { testSlowJob(t, slowJobC) }

// Either build attaches to the jobs the other started (a plugin upgraded
// from one build to the other, its Runs in flight): the KV records are
// one format.
func TestSlowJobBuildsTakeOverEachOthersJobs(t *testing.T) {
	ctx := context.Background()
	for _, pair := range [][2]string{{"slow-job", slowJobC}, {slowJobC, "slow-job"}} {
		e := newEnv(t)
		first := e.executor(t, pair[0], asSlowJob)
		c := toolCall("run_1.t1.0", 1, "slow_job", map[string]any{"seconds": 2.5, "label": "hand <over> & ✓"})
		if r, err := first.Start(ctx, c); err != nil || r.State != abi.StatePending {
			t.Fatalf("%s start: %+v %v", pair[0], r, err)
		}
		second := restart(t, e.clock, e.kv).executor(t, pair[1], asSlowJob)
		if r, err := second.Attach(ctx, c); err != nil || r.State != abi.StatePending || r.Handle != "job/run_1.t1.0#1" {
			t.Fatalf("%s attach to %s's job: %+v %v", pair[1], pair[0], r, err)
		}
		e.clock.Advance(2500 * time.Millisecond)
		if o := tool(t)(second.Attach(ctx, c)); o.Content != `slow job "hand <over> & ✓" finished after 2.5 s` {
			t.Fatalf("%s attach to %s's job, when due: %+v", pair[1], pair[0], o)
		}
		if got := e.execCount(t, "run_1.t1.0", 1); got != "1" {
			t.Fatalf("exec count %q", got)
		}
	}
}

// TestSlowJobCMatchesGo makes the same random calls, at the same times,
// on the Go and the C builds, each over its own KV, and wants the same
// replies, the same KV records (as JSON values) and the same progress
// events; KV records written corrupt by the test, too. Where the Go build
// quotes Go's JSON decoder (a corrupt record, arguments of the wrong
// type), the replies are compared up to it.
func TestSlowJobCMatchesGo(t *testing.T) {
	ctx := context.Background()
	type side struct {
		e *env
		x *host.Executor
	}
	sides := [2]side{}
	for i, dir := range []string{"slow-job", slowJobC} {
		e := newEnv(t)
		sides[i] = side{e, e.executor(t, dir, asSlowJob)}
	}
	for i, cfg := range []map[string]string{nil, {"version": "2.0.0", "attaches_from": "1.0.0,1.5"}} {
		var d [2]abi.Describe
		for k, dir := range []string{"slow-job", slowJobC} {
			d[k] = sides[k].e.load(t, dir, abi.RoleExecutor, func(s *host.PluginSpec) {
				s.Name = fmt.Sprintf("describe-%d", i)
				s.Sandbox.Config = cfg
			}).Describe()
		}
		if !reflect.DeepEqual(d[0], d[1]) {
			t.Fatalf("describe with config %v differs:\n Go %+v\n  C %+v", cfg, d[0], d[1])
		}
	}
	argSets := []any{
		map[string]any{"seconds": 1, "label": "demo"}, map[string]any{"seconds": 2.5}, map[string]any{"seconds": 0.001, "label": ""},
		map[string]any{"seconds": 86400, "label": "<&> é ✓ \"q\" \u2028"}, map[string]any{"seconds": 86401}, map[string]any{"seconds": 0},
		map[string]any{"seconds": -1}, map[string]any{"seconds": "soon"}, map[string]any{"seconds": nil}, map[string]any{"label": "x"},
		map[string]any{"seconds": 1e300}, map[string]any{"seconds": 3, "label": 5}, map[string]any{"SECONDS": 2, "Label": "case"},
		json.RawMessage(`{"seconds":1,"seconds":null}`), json.RawMessage(`{"label":"a","label":null,"seconds":1}`),
		json.RawMessage(`[1]`), json.RawMessage(`"s"`), json.RawMessage(`{"seconds":1e-400}`), nil,
		map[string]any{"seconds": 0.1234567890123, "label": "\x01tab\there"},
	}
	corrupt := []string{`{"state":5}`, `not json`, `null`, `{"state":"running","seconds":"x"}`, `{"state":"cancelled","label":"c","due_ms":1}`,
		`{"state":"running","label":"neg","seconds":-2,"due_ms":99999999999999,"exec":3}`}
	rng := rand.New(rand.NewSource(1))
	reached := map[string]int{}
	kvKeys := func(effect string, attempt int) []string {
		return []string{fmt.Sprintf("job/%s#%d", effect, attempt), fmt.Sprintf("exec/%s#%d", effect, attempt)}
	}
	for step := 0; step < 1500; step++ {
		effect, attempt := fmt.Sprintf("run_%d.t1.0", rng.Intn(4)), 1+rng.Intn(2)
		var (
			op   string
			call = toolCall(effect, attempt, "slow_job", argSets[rng.Intn(len(argSets))])
		)
		if raw, ok := argSets[rng.Intn(len(argSets))].(json.RawMessage); ok && rng.Intn(3) == 0 {
			call.Input.Effect.Request = json.RawMessage(`{"arguments":` + string(raw) + `}`)
			if raw == nil {
				call.Input.Effect.Request = nil
			}
		}
		switch rng.Intn(8) {
		case 0, 1:
			op = "start"
		case 2:
			op = "poll"
		case 3:
			op = "attach"
		case 4:
			op = "cancel"
		case 5:
			d := time.Duration(rng.Intn(3000)) * time.Millisecond
			for _, s := range sides {
				s.e.clock.Advance(d)
			}
			continue
		case 6:
			if rng.Intn(4) == 0 {
				key, value := kvKeys(effect, attempt)[0], corrupt[rng.Intn(len(corrupt))]
				if rng.Intn(3) == 0 {
					key, value = kvKeys(effect, attempt)[1], []string{"x", "7", "-1", "99999999999999999999"}[rng.Intn(4)]
				}
				for _, s := range sides {
					if err := s.e.kv.KVSet(ctx, "acme", "slow-job", []byte(key), []byte(value)); err != nil {
						t.Fatal(err)
					}
				}
			}
			continue
		default:
			op = "start"
			if rng.Intn(2) == 0 {
				call.Input.Effect.Tool = []string{"", "other", "slow_jobs"}[rng.Intn(3)]
			}
		}
		before := [2]int{}
		var replies [2]abi.EffectReply
		var errs [2]error
		for k, s := range sides {
			before[k] = len(s.e.events.all())
			switch op {
			case "start":
				replies[k], errs[k] = s.x.Start(ctx, call)
			case "poll":
				replies[k], errs[k] = s.x.Poll(ctx, call)
			case "attach":
				replies[k], errs[k] = s.x.Attach(ctx, call)
			case "cancel":
				var cr abi.CancelReply
				cr, errs[k] = s.x.Cancel(ctx, call)
				replies[k] = abi.EffectReply{State: cr.State, Outcome: cr.Outcome}
			}
		}
		what := fmt.Sprintf("step %d: %s %s#%d %s", step, op, effect, attempt, call.Input.Effect.Request)
		reached[slowJobReplyKind(op, replies[0], errs[0])]++
		if (errs[0] == nil) != (errs[1] == nil) {
			t.Fatalf("%s: errors differ:\n Go %v\n  C %v", what, errs[0], errs[1])
		}
		if errs[0] != nil {
			if classOf(t, errs[0]) != classOf(t, errs[1]) || upTo(afterPluginName(errs[0]), "corrupt: ") != upTo(afterPluginName(errs[1]), "corrupt: ") {
				t.Fatalf("%s: errors differ:\n Go %v\n  C %v", what, errs[0], errs[1])
			}
		} else if !sameToolReply(t, replies[0], replies[1]) {
			t.Fatalf("%s: replies differ:\n Go %s\n  C %s", what, mustJSON(t, replies[0]), mustJSON(t, replies[1]))
		}
		if g, c := sides[0].e.events.all()[before[0]:], sides[1].e.events.all()[before[1]:]; !reflect.DeepEqual(g, c) {
			t.Fatalf("%s: events differ:\n Go %+v\n  C %+v", what, g, c)
		}
		for _, key := range kvKeys(effect, attempt) {
			var v [2]any
			for k, s := range sides {
				b, err := s.e.kv.KVGet(ctx, "acme", "slow-job", []byte(key))
				if err != nil {
					t.Fatal(err)
				}
				if json.Unmarshal(b, &v[k]) != nil {
					v[k] = string(b)
				}
			}
			if !reflect.DeepEqual(v[0], v[1]) {
				t.Fatalf("%s: KV %s differs:\n Go %v\n  C %v", what, key, v[0], v[1])
			}
		}
	}
	for _, kind := range slowJobReplyKinds {
		if reached[kind] == 0 {
			t.Errorf("no call got a reply of the kind %q: %v", kind, reached)
		}
	}
}

// slowJobReplyKinds are the ways slow-job answers, as slowJobReplyKind
// names them: the random calls must reach each.
var slowJobReplyKinds = []string{
	"start pending", "start done", "start failed: no tool", "start failed: cancelled", "start failed: corrupt record",
	"start failed: corrupt counter", "start error: arguments", "start error: seconds", "poll pending", "poll done",
	"poll unknown", "attach pending", "attach done", "attach unknown", "cancel cancelled", "cancel done", "cancel unknown",
	"cancel error",
}

func slowJobReplyKind(op string, r abi.EffectReply, err error) string {
	switch {
	case err != nil:
		return op + " error"
	case r.State == abi.StateFailed && strings.Contains(r.Error.Message, "no tool"):
		return op + " failed: no tool"
	case r.State == abi.StateFailed && strings.Contains(r.Error.Message, "was cancelled"):
		return op + " failed: cancelled"
	case r.State == abi.StateFailed && strings.Contains(r.Error.Message, "the record"):
		return op + " failed: corrupt record"
	case r.State == abi.StateFailed && strings.Contains(r.Error.Message, "the counter"):
		return op + " failed: corrupt counter"
	case r.State == abi.StateDone && strings.Contains(string(r.Outcome), "error: the arguments"):
		return op + " error: arguments"
	case r.State == abi.StateDone && strings.Contains(string(r.Outcome), `error: \"seconds\"`):
		return op + " error: seconds"
	}
	return op + " " + string(r.State)
}

// afterPluginName is an error's text from its export on: the builds'
// plugin names are one, but a host error may say where it was loaded.
func afterPluginName(err error) string {
	s := err.Error()
	if i := strings.Index(s, "export["); i >= 0 {
		return s[i:]
	}
	return s
}

// sameToolReply compares two replies of a tool executor: state, handle,
// poll interval and outcome (as JSON values) exactly, and the error's
// message up to where the Go build quotes its JSON decoder.
func sameToolReply(t *testing.T, a, b abi.EffectReply) bool {
	t.Helper()
	if a.State != b.State || a.Handle != b.Handle || a.PollAfterMS != b.PollAfterMS || (a.Error == nil) != (b.Error == nil) {
		return false
	}
	if a.Error != nil {
		if a.Error.Retriable != b.Error.Retriable || a.Error.Class != b.Error.Class ||
			upTo(a.Error.Message, "corrupt: ") != upTo(b.Error.Message, "corrupt: ") {
			return false
		}
	}
	if len(a.Outcome) == 0 || len(b.Outcome) == 0 {
		return len(a.Outcome) == len(b.Outcome)
	}
	var oa, ob abi.ToolOutcome
	if json.Unmarshal(a.Outcome, &oa) != nil || json.Unmarshal(b.Outcome, &ob) != nil {
		return false
	}
	const usage = `string}: ` // the arguments' usage line, then Go's decoder
	if strings.HasPrefix(oa.Content, "error: the arguments must be") {
		return oa.IsError == ob.IsError && upTo(oa.Content, usage) == upTo(ob.Content, usage)
	}
	return reflect.DeepEqual(oa, ob)
}
