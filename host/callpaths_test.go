package host

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The differential test of the host's two call paths: every plugin in the
// repository, on the native path (native.go, kernel.go) and on extism
// go-sdk's (sdkpath.go), given the same calls in the same order, must give
// byte-identical outputs, the same error classes and the same words of its
// own, and leave the same KV and the same events behind. A plugin cannot
// tell the paths apart; this is where that is checked.
//
// Both hosts start from the same fake clock and the same KV content, and
// move their clocks together, so the plugins that read the clock
// (agenthost_now_ms, the WASI clocks) see the same time on both. WASI's
// random source is wazero's deterministic default on both paths, so Go
// guests iterate their maps in the same order too: no plugin of the
// repository is nondeterministic, and every comparison is exact.

// cpTenant is the tenant of every call.
const cpTenant = "acme"

// cpMaxInput is every plugin's max_input_bytes here, which the corpus
// goes up to and one past. The default (1 MiB) would do the same at a cost
// of seconds a call: a Go guest on go-pdk reads its input with one host
// call per 8 bytes, and the executors echo it back.
const cpMaxInput = 32 << 10

// cpCall is one call of a plugin's sequence.
type cpCall struct {
	name   string // the input's name, for the failure message
	export string
	input  []byte
	// kind decodes the reply of an effect export (start, poll, attach,
	// cancel) as that kind's.
	kind abi.EffectKind
	// effect, when set, is also run through the Executor adapter (after
	// the raw call), and build through the Builder adapter.
	effect *runtime.EffectCall
	build  *abi.BuildInput
	// advance moves both hosts' clocks before the call.
	advance time.Duration
}

// cpResult is what one call gave on one path: everything a plugin's
// caller can see, and the error's text (shown, not compared: the paths
// word their traps differently).
type cpResult struct {
	out     []byte
	class   string // "" on success
	message string // the plugin's own words (*runtime.PluginMessage)
	decoded string // the reply decoded by package abi, or the decode error
	adapter string // the adapter's result, when the call has one
	err     string
}

func (r cpResult) String() string {
	out := r.out
	tail := ""
	if len(out) > 240 {
		out, tail = out[:240], fmt.Sprintf("... (%d bytes)", len(r.out))
	}
	return fmt.Sprintf("class=%q message=%q out=%q%s\n\t\tdecoded=%s\n\t\tadapter=%s\n\t\terror=%s", r.class, r.message, out, tail, r.decoded, r.adapter, r.err)
}

// differs says how two results differ, "" when they agree.
func (r cpResult) differs(o cpResult) string {
	var d []string
	if !bytes.Equal(r.out, o.out) {
		d = append(d, "output bytes")
	}
	if r.class != o.class {
		d = append(d, "error class")
	}
	if r.message != o.message {
		d = append(d, "the plugin's message")
	}
	if r.decoded != o.decoded {
		d = append(d, "decoded reply")
	}
	if r.adapter != o.adapter {
		d = append(d, "adapter result")
	}
	return strings.Join(d, ", ")
}

// errClass is an error's class: the *runtime.PluginError's, or what kind of
// other error it is.
func errClass(err error) string {
	if err == nil {
		return ""
	}
	var pe *runtime.PluginError
	switch {
	case errors.As(err, &pe):
		return string(pe.Class)
	case errors.Is(err, runtime.ErrExecutorUnavailable):
		return "not a PluginError (executor unavailable)"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "not a PluginError (context)"
	case errors.Is(err, ErrClosed):
		return "not a PluginError (closed)"
	default:
		return fmt.Sprintf("not a PluginError (%T)", err)
	}
}

func pluginWords(err error) string {
	var m *runtime.PluginMessage
	if errors.As(err, &m) {
		return m.Text
	}
	return ""
}

// asJSON renders a decoded value and its error for comparison.
func asJSON(v any, err error) string {
	b, _ := json.Marshal(v)
	if err != nil {
		return string(b) + " error: " + err.Error()
	}
	return string(b)
}

// cpSide is one call path's host, with its own KV, sink and clock.
type cpSide struct {
	path CallPath
	*env
}

func newCPSide(t testing.TB, path CallPath, kv map[string]string) *cpSide {
	e := newEnv(t, Config{CallPath: path})
	for k, v := range kv {
		e.kv.data[k] = []byte(v)
	}
	return &cpSide{path: path, env: e}
}

// do runs one call: raw, then through the adapter when the call has one.
func (sd *cpSide) do(ctx context.Context, p *Plugin, c cpCall) cpResult {
	if c.advance > 0 {
		sd.clock.Advance(c.advance)
	}
	out, err := p.CallRaw(ctx, cpTenant, c.export, c.input)
	r := cpResult{out: out, class: errClass(err), message: pluginWords(err)}
	if err != nil {
		r.err = err.Error()
	} else {
		switch c.export {
		case abi.ExportDescribe:
			r.decoded = asJSON(abi.DecodeDescribe(out, p.spec.Role))
		case abi.ExportBuild:
			r.decoded = asJSON(abi.DecodeBuildOutput(out))
		case abi.ExportStart, abi.ExportPoll, abi.ExportAttach:
			r.decoded = asJSON(abi.DecodeEffectReply(out, c.kind, c.export))
		case abi.ExportCancel:
			r.decoded = asJSON(abi.DecodeCancelReply(out, c.kind))
		}
	}
	adapterResult := func(v any, err error) string {
		if err != nil {
			return fmt.Sprintf("class %s, message %q", errClass(err), pluginWords(err))
		}
		return asJSON(v, nil)
	}
	switch {
	case c.effect != nil:
		x, err := p.Executor()
		if err != nil {
			r.adapter = "no executor: " + err.Error()
			break
		}
		switch c.export {
		case abi.ExportStart:
			r.adapter = adapterResult(x.Start(ctx, *c.effect))
		case abi.ExportPoll:
			r.adapter = adapterResult(x.Poll(ctx, *c.effect))
		case abi.ExportAttach:
			r.adapter = adapterResult(x.Attach(ctx, *c.effect))
		case abi.ExportCancel:
			r.adapter = adapterResult(x.Cancel(ctx, *c.effect))
		}
	case c.build != nil:
		b, err := p.Builder()
		if err != nil {
			r.adapter = "no builder: " + err.Error()
			break
		}
		r.adapter = adapterResult(b.Build(ctx, cpTenant, *c.build))
	}
	return r
}

// doWithin is do, given up after limit: a call that has not answered by
// then is recorded as hung (the class "hung"), and ok is false. Its
// goroutine, and the instance it holds, are left behind: nothing can stop
// a call that its own timeout did not.
func (sd *cpSide) doWithin(ctx context.Context, p *Plugin, c cpCall, limit time.Duration) (r cpResult, ok bool) {
	done := make(chan cpResult, 1)
	go func() { done <- sd.do(ctx, p, c) }()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case r = <-done:
		return r, true
	case <-t.C:
		return cpResult{class: "hung", err: fmt.Sprintf("no answer %s after the call began (the call timeout is %s)", limit, p.Spec().Limits.CallTimeout)}, false
	}
}

// watchdog is how long a call may take before doWithin gives up on it: a
// raw call and an adapter call, each bounded by the call timeout and
// each perhaps on a new instance, whose initialisation the init timeout
// bounds, and room for a loaded machine under -race.
func watchdog(p *Plugin) time.Duration {
	l := p.Spec().Limits
	return 2*(l.InitTimeout+l.CallTimeout) + 30*time.Second
}

// kvDump and events are what the calls left behind.
func (sd *cpSide) kvDump() map[string]string {
	sd.kv.mu.Lock()
	defer sd.kv.mu.Unlock()
	m := map[string]string{}
	for k, v := range sd.kv.data {
		m[k] = string(v)
	}
	return m
}

// events are the events the calls emitted, the model deltas of one
// attempt in a row merged into one (mergeDeltas).
func (sd *cpSide) events() []string {
	var out []string
	for _, e := range mergeDeltas(sd.sink.all()) {
		b, _ := json.Marshal(e.ev)
		out = append(out, fmt.Sprintf("%+v %s", e.scope, b))
	}
	return out
}

// mergeDeltas merges the model deltas that one attempt emits in a row
// into one: the text and each tool call's arguments concatenated, in
// order. How a streamed answer is cut into deltas follows how its bytes
// arrive from the model's server (a plugin emits what each read brought),
// which is the network's timing, not the call path's; the answer they
// make up is what the paths must agree on.
func mergeDeltas(evs []emitted) []emitted {
	var out []emitted
	sameAttempt := func(a, b runtime.EmitScope) bool {
		a.DeltaSeq, b.DeltaSeq = 0, 0
		return a == b
	}
	for _, e := range evs {
		if n := len(out); n > 0 && e.ev.Type == abi.EmitModelDelta && e.ev.Delta != nil &&
			out[n-1].ev.Type == abi.EmitModelDelta && out[n-1].ev.Delta != nil && sameAttempt(out[n-1].scope, e.scope) {
			merged := *out[n-1].ev.Delta
			merged.Text += e.ev.Delta.Text
			merged.ToolCalls = append(slices.Clone(merged.ToolCalls), e.ev.Delta.ToolCalls...)
			out[n-1].ev.Delta = &merged
			continue
		}
		if e.ev.Type == abi.EmitModelDelta {
			e.scope.DeltaSeq = 0
		}
		out = append(out, e)
	}
	for i := range out {
		if d := out[i].ev.Delta; d != nil && len(d.ToolCalls) > 1 {
			out[i].ev.Delta = &abi.ModelDelta{Text: d.Text, ToolCalls: mergeToolCallPieces(d.ToolCalls)}
		}
	}
	return out
}

// mergeToolCallPieces merges the pieces of each tool call (by Index) into
// one, its first ID and name and its arguments concatenated, in the order
// of the calls' first pieces.
func mergeToolCallPieces(pieces []abi.ToolCallDelta) []abi.ToolCallDelta {
	var out []abi.ToolCallDelta
	at := map[int]int{}
	for _, p := range pieces {
		i, ok := at[p.Index]
		if !ok {
			at[p.Index] = len(out)
			out = append(out, p)
			continue
		}
		if out[i].ID == "" {
			out[i].ID = p.ID
		}
		if out[i].Name == "" {
			out[i].Name = p.Name
		}
		out[i].Arguments += p.Arguments
	}
	return out
}

// cpPlugin is one plugin of the repository and its calls.
type cpPlugin struct {
	name  string
	wasm  func() (string, error)
	role  abi.Role
	kind  abi.EffectKind // the kind its effect exports' replies decode as
	spec  func(*PluginSpec)
	kv    map[string]string // the KV both hosts start with, by the plugin's own keys
	calls []cpCall
	// exports are the plugin's exports the generic corpus goes to.
	exports []string
}

// TestCallPathsAgree runs every plugin of the repository through both call
// paths and compares every call.
func TestCallPathsAgree(t *testing.T) {
	srv := newCPServer(t)
	plugins := cpPlugins(t, srv)
	// Every plugin of the repository is in the table, whoever adds one.
	covered := map[string]bool{}
	for _, p := range plugins {
		covered[p.name] = true
	}
	examples, err := conformance.ListExamplePlugins()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append(examples, conformance.Plugins...) {
		if !covered[name] {
			t.Errorf("plugin %s is not in TestCallPathsAgree's table (cpPlugins): add it with the calls its exports take", name)
		}
	}

	sides := map[CallPath]*cpSide{}
	kv := map[string]string{}
	for _, p := range plugins {
		for k, v := range p.kv {
			kv[kvKey(cpTenant, p.name, []byte(k))] = v
		}
	}
	for _, path := range []CallPath{CallPathNative, CallPathSDK} {
		sides[path] = newCPSide(t, path, kv)
	}
	native, sdk := sides[CallPathNative], sides[CallPathSDK]

	for _, cp := range plugins {
		t.Run(cp.name, func(t *testing.T) {
			if testing.Short() && !conformance.IsGoExample(cp.name) && !slices.Contains(conformance.Plugins, cp.name) {
				t.Skipf("-short (make check) builds no C or AssemblyScript plugin such as %s: make test checks it", cp.name)
			}
			path, err := cp.wasm()
			if err != nil {
				t.Fatalf("building %s: %v", cp.name, err)
			}
			spec := PluginSpec{Name: cp.name, Path: path, Role: cp.role, Limits: Limits{MaxInputBytes: cpMaxInput}}
			if cp.spec != nil {
				cp.spec(&spec)
			}
			calls := append(append([]cpCall(nil), cp.calls...), genericCalls(cp, spec)...)

			var wg sync.WaitGroup
			results := map[CallPath][]cpResult{}
			descs := map[CallPath]abi.Describe{}
			loadErrs := map[CallPath]error{}
			var mu sync.Mutex
			for _, sd := range []*cpSide{native, sdk} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					p, err := sd.h.Load(ctx, spec)
					if err != nil {
						mu.Lock()
						loadErrs[sd.path] = err
						mu.Unlock()
						return
					}
					rs := make([]cpResult, 0, len(calls))
					hung := false
					for _, c := range calls {
						r, ok := sd.doWithin(ctx, p, c, watchdog(p))
						rs = append(rs, r)
						if hung = !ok; hung {
							break // the rest would run on a stuck pool
						}
					}
					if !hung { // a hung call's plugin is left as it is
						p.Close(ctx)
					}
					mu.Lock()
					results[sd.path], descs[sd.path] = rs, p.Describe()
					mu.Unlock()
				}()
			}
			wg.Wait()
			if len(loadErrs) > 0 {
				t.Fatalf("load: native: %v; extism-sdk: %v", loadErrs[CallPathNative], loadErrs[CallPathSDK])
			}
			if !reflect.DeepEqual(descs[CallPathNative], descs[CallPathSDK]) {
				t.Errorf("%s: describe at load differs:\n\tnative:     %+v\n\textism-sdk: %+v", cp.name, descs[CallPathNative], descs[CallPathSDK])
			}
			// A call that ran past its call timeout on one path only says
			// how fast the machine was then (a loaded one, under -race),
			// not what the paths do: it runs again on both, on plugins
			// loaded with a call timeout of cpSlowCallTimeout, and those
			// results are the ones compared.
			for i, c := range calls {
				if i >= len(results[CallPathNative]) || i >= len(results[CallPathSDK]) {
					break
				}
				a, b := results[CallPathNative][i], results[CallPathSDK][i]
				if a.timedOut() == b.timedOut() || a.class == "hung" || b.class == "hung" {
					continue
				}
				again := runOnBothUntimed(t, native, sdk, spec, c)
				t.Logf("plugin %s, export %s, input %q (call %d of %d) ran past its call timeout (%s) on one path only; run again on both with a timeout of %s",
					cp.name, c.export, c.name, i+1, len(calls), spec.Limits.withDefaults().CallTimeout, cpSlowCallTimeout)
				results[CallPathNative][i], results[CallPathSDK][i] = again[CallPathNative], again[CallPathSDK]
			}
			bad := 0
			for i, c := range calls {
				if i >= len(results[CallPathNative]) || i >= len(results[CallPathSDK]) {
					t.Errorf("plugin %s: a path hung at call %d of %d (above); the calls after it were not run", cp.name, i, len(calls))
					break
				}
				a, b := results[CallPathNative][i], results[CallPathSDK][i]
				if d := a.differs(b); d != "" {
					bad++
					if bad <= 8 {
						t.Errorf("plugin %s, export %s, input %q (call %d of %d): the paths differ in %s\n\tnative:     %s\n\textism-sdk: %s",
							cp.name, c.export, c.name, i+1, len(calls), d, a, b)
					}
				}
			}
			if bad > 8 {
				t.Errorf("plugin %s: %d calls differ in all (the first 8 shown)", cp.name, bad)
			}
			if a, b := native.kvDump(), sdk.kvDump(); !reflect.DeepEqual(a, b) {
				t.Errorf("plugin %s: the KV differs after the calls:\n\tnative:     %q\n\textism-sdk: %q", cp.name, a, b)
			}
			if a, b := native.events(), sdk.events(); !reflect.DeepEqual(a, b) {
				t.Errorf("plugin %s: the emitted events differ:\n\tnative:     %q\n\textism-sdk: %q", cp.name, a, b)
			}
			t.Logf("%s: %d calls agree on both paths", cp.name, len(calls)-bad)
		})
	}
}

// cpSlowCallTimeout is the call timeout of a call run again because it
// ran past the plugin's own on one path only: long enough for any call
// that ends, on any machine that runs the suite.
const cpSlowCallTimeout = 5 * time.Minute

// timedOut reports whether the call, raw or through its adapter, ran past
// its call timeout.
func (r cpResult) timedOut() bool {
	return r.class == string(abi.ClassPluginTimeout) || strings.Contains(r.adapter, "class "+string(abi.ClassPluginTimeout))
}

// runOnBothUntimed runs c once more on each side, on a plugin of spec
// loaded with a call timeout of cpSlowCallTimeout, and returns what each
// gave. The clocks are not advanced again.
func runOnBothUntimed(t *testing.T, native, sdk *cpSide, spec PluginSpec, c cpCall) map[CallPath]cpResult {
	t.Helper()
	spec.Limits.CallTimeout = cpSlowCallTimeout
	c.advance = 0
	out := map[CallPath]cpResult{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, sd := range []*cpSide{native, sdk} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			r := cpResult{class: "load", err: "the plugin did not load again"}
			if p, err := sd.h.Load(ctx, spec); err != nil {
				r.err = err.Error()
			} else {
				var ok bool
				if r, ok = sd.doWithin(ctx, p, c, watchdog(p)); ok {
					p.Close(ctx)
				}
			}
			mu.Lock()
			out[sd.path] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// genericCalls is the corpus every export of a plugin gets: empty,
// malformed and hostile JSON, and inputs at and over max_input_bytes.
func genericCalls(cp cpPlugin, spec PluginSpec) []cpCall {
	maxIn := spec.Limits.withDefaults().MaxInputBytes
	// A probe program of max_input_bytes of JSON is half a million host
	// calls: whether it ends within the call timeout depends on the path's
	// speed, which is not what the paths must agree on. The probe gets
	// "program at max_input_bytes" instead.
	cheapOnly := func(export string) bool { return export == "probe" }
	kind := cp.kind
	if kind == "" {
		kind = abi.KindTool
	}
	pad := func(prefix, suffix string, total int) []byte {
		n := total - len(prefix) - len(suffix)
		return []byte(prefix + strings.Repeat("x", max(n, 0)) + suffix)
	}
	validPrefix := `{"abi":1,"run":{"id":"r","tenant":"acme","session":"s1","step":1,"input":"hi"},"effect":{"id":"r.t1.0","assignment_key":"acme/s1/r.t1.0#1","attempt":1,"kind":"` + string(kind) + `","tool":"echo","request":{"arguments":{"text":"`
	validSuffix := `"}}},"handle":""}`
	inputs := []struct {
		name  string
		input []byte
	}{
		{"empty", nil},
		{"malformed JSON", []byte(`{"abi":1,"effect":{"id":`)},
		{"not an object", []byte(`[1,2,3]`)},
		{"null", []byte(`null`)},
		{"trailing garbage", []byte(`{"abi":1} {"abi":2}`)},
		{"wrong types", []byte(`{"abi":"1","effect":{"id":7,"attempt":"one","kind":["tool"],"request":"x"},"run":[],"history":{},"handle":3}`)},
		{"deep nesting 5000", []byte(`{"abi":1,"effect":` + strings.Repeat(`{"a":`, 5000) + `1` + strings.Repeat("}", 5000) + `}`)},
		{"deep nesting 12000, past encoding/json's limit", []byte(`{"abi":1,"x":` + strings.Repeat("[", 12000) + strings.Repeat("]", 12000) + `}`)},
		{"huge numbers", []byte(`{"abi":1e999,"effect":{"id":"r.t1.0","attempt":123456789012345678901234567890,"kind":"tool","tool":"echo","request":{"arguments":{"a":1e308,"b":-1e308,"text":"x"}},"deadline_ms":-99999999999999999999},"run":{"step":1e400}}`)},
		{"invalid UTF-8", []byte("{\"abi\":1,\"effect\":{\"id\":\"r\xff\xfe.t1.0\",\"attempt\":1,\"kind\":\"tool\",\"tool\":\"echo\",\"request\":{\"arguments\":{\"text\":\"\xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80\"}}},\"run\":{\"id\":\"\xc0\xaf\",\"input\":\"\xff\"}}")},
		{"NUL bytes", []byte("{\"abi\":1,\"effect\":{\"id\":\"r\\u0000.t1.0\",\"attempt\":1,\"kind\":\"tool\",\"tool\":\"echo\\u0000\",\"request\":{\"arguments\":{\"text\":\"a\\u0000b\"}}}}\x00\x00")},
		{"raw NUL", []byte("\x00{\"abi\":1}")},
		{"valid, exactly max_input_bytes", pad(validPrefix, validSuffix, maxIn)},
		{"garbage, exactly max_input_bytes", bytes.Repeat([]byte{'{'}, maxIn)},
		{"valid, one over max_input_bytes", pad(validPrefix, validSuffix, maxIn+1)},
	}
	var calls []cpCall
	exports := append([]string{abi.ExportDescribe}, cp.exports...)
	for _, e := range exports {
		for _, in := range inputs {
			if cheapOnly(e) && len(in.input) >= maxIn {
				continue
			}
			calls = append(calls, cpCall{name: in.name, export: e, input: in.input, kind: kind})
		}
	}
	// Exports that are not there, and the marker (no result).
	calls = append(calls,
		cpCall{name: "a missing export", export: "no_such_export", input: []byte(`{"abi":1}`)},
		cpCall{name: "the marker", export: "agenthost_abi_v1", input: []byte(`{"abi":1}`)},
		cpCall{name: "after the edge cases", export: abi.ExportDescribe, input: []byte(`{"abi":1}`)},
	)
	return calls
}

// effectCall encodes an effect call as the Executor adapter does, and
// returns the call for both the raw and the adapter run.
func effectCall(name, export string, c runtime.EffectCall) cpCall {
	in := c.Input
	in.ABI = abi.Version
	b, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	return cpCall{name: name, export: export, input: b, kind: in.Effect.Kind, effect: &c}
}

func buildCall(name string, in abi.BuildInput) cpCall {
	in.ABI = abi.Version
	b, err := json.Marshal(in)
	if err != nil {
		panic(err)
	}
	return cpCall{name: name, export: abi.ExportBuild, input: b, build: &in}
}

func cpModelCall(effect string, attempt int, msgs ...abi.Message) runtime.EffectCall {
	req, _ := json.Marshal(abi.ModelRequest{Messages: msgs, Tools: []abi.Tool{{Name: "calculate", Description: "Evaluate an arithmetic expression", InputSchema: json.RawMessage(`{"type":"object"}`)}}})
	return runtime.EffectCall{Tenant: cpTenant, Session: "s1", RunID: "run1", Input: abi.EffectInput{
		Effect: abi.Effect{ID: effect, AssignmentKey: fmt.Sprintf("%s/s1/%s#%d", cpTenant, effect, attempt), Attempt: attempt, Kind: abi.KindModel, Request: req},
	}}
}

// lifecycle is start, poll, attach and cancel of one effect call.
func lifecycle(name string, c runtime.EffectCall, advance time.Duration) []cpCall {
	calls := []cpCall{
		effectCall(name, abi.ExportStart, c),
		effectCall(name+" again (idempotent)", abi.ExportStart, c),
		effectCall(name, abi.ExportPoll, c),
	}
	later := effectCall(name+" later", abi.ExportPoll, c)
	later.advance = advance
	calls = append(calls, later,
		effectCall(name, abi.ExportAttach, c),
		effectCall(name, abi.ExportCancel, c),
		effectCall(name+" after cancel", abi.ExportAttach, c),
	)
	return calls
}

var cpExecutorExports = []string{abi.ExportStart, abi.ExportPoll, abi.ExportAttach, abi.ExportCancel}

// calcCases is the calculators' shared table: the expressions of
// examples/plugins/calculator/expr/testdata/cases.json, the one the Go, C
// and AssemblyScript calculators are all held to.
func calcCases(t *testing.T) []string {
	b, err := os.ReadFile(filepath.Join("..", "examples", "plugins", "calculator", "expr", "testdata", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cs []struct {
		Expr string `json:"expr"`
	}
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range cs {
		out = append(out, c.Expr)
	}
	return out
}

func calculatorCalls(t *testing.T) []cpCall {
	var calls []cpCall
	for i, e := range calcCases(t) {
		calls = append(calls, effectCall("calculate "+e, abi.ExportStart, toolCall(cpTenant, fmt.Sprintf("run1.t1.%d", i), 1, "calculate", map[string]string{"expression": e})))
	}
	for i, args := range []any{map[string]any{}, map[string]any{"expression": 5}, map[string]any{"expr": "1+1"}, []int{1}, nil,
		map[string]string{"expression": strings.Repeat("(", 3000) + "1" + strings.Repeat(")", 3000)},
		map[string]string{"expression": strings.Repeat("1+", 20000) + "1"},
		map[string]string{"expression": "1e308*10"}, map[string]string{"expression": "\x00"}} {
		calls = append(calls, effectCall(fmt.Sprintf("calculate with arguments %.60v", args), abi.ExportStart, toolCall(cpTenant, fmt.Sprintf("run1.t2.%d", i), 1, "calculate", args)))
	}
	c := toolCall(cpTenant, "run1.t3.0", 1, "calculate", nil)
	c.Input.Effect.Request = nil
	calls = append(calls, effectCall("calculate without a request", abi.ExportStart, c))
	calls = append(calls, effectCall("another tool", abi.ExportStart, toolCall(cpTenant, "run1.t3.1", 1, "nope", map[string]string{"expression": "1"})))
	calls = append(calls, lifecycle("calculate 2+3", toolCall(cpTenant, "run1.t4.0", 1, "calculate", map[string]string{"expression": "2+3"}), time.Second)...)
	return calls
}

// cpServer is the HTTP server the openai and hostile plugins reach: a fake
// chat-completions endpoint and a few fixed pages, on 127.0.0.1. The
// anthropic plugin reaches a conformance.FakeAnthropic of its own.
type cpServer struct {
	srv  *httptest.Server
	port string
}

func newCPServer(t *testing.T) *cpServer {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("content-type", "application/json")
		last := ""
		if n := len(body.Messages); n > 0 {
			last = body.Messages[n-1].Content
		}
		switch last {
		case "answer 500":
			w.WriteHeader(500)
			io.WriteString(w, `{"error":{"message":"the server is on fire"}}`)
		case "answer garbage":
			io.WriteString(w, `{"choices":[{"message":`)
		case "call a tool":
			io.WriteString(w, `{"choices":[{"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"tool_calls":[{"id":"call_abc","type":"function","function":{"name":"calculate","arguments":"{\"expression\":\"(2+3)*4\"}"}}]}}],"usage":{"prompt_tokens":61,"completion_tokens":17}}`)
		default:
			fmt.Fprintf(w, `{"choices":[{"finish_reason":"stop","message":{"role":"assistant","content":%q}}],"usage":{"prompt_tokens":%d,"completion_tokens":3}}`, "you said: "+last, len(body.Messages))
		}
	})
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from the test server") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(bytes.Repeat([]byte("b"), 2<<20)) })
	s := &cpServer{srv: httptest.NewServer(mux)}
	t.Cleanup(s.srv.Close)
	_, s.port, _ = net.SplitHostPort(s.srv.Listener.Addr().String())
	return s
}

func (s *cpServer) url(path string) string { return "http://127.0.0.1:" + s.port + path }

// cpPlugins is every plugin of the repository, with its calls.
func cpPlugins(t *testing.T, srv *cpServer) []cpPlugin {
	example := func(name string) func() (string, error) {
		return func() (string, error) { return conformance.BuildExampleWasm(name) }
	}
	conf := func(name string) func() (string, error) {
		return func() (string, error) { return conformance.BuildPlugin(name) }
	}
	// The anthropic plugin's server checks every request as the API does.
	claude := conformance.NewFakeAnthropic(t, "sk-ant-test")
	tc := func(effect string, attempt int, tool string, args any) runtime.EffectCall {
		return toolCall(cpTenant, effect, attempt, tool, args)
	}
	start := func(name string, c runtime.EffectCall) cpCall { return effectCall(name, abi.ExportStart, c) }
	user := func(s string) abi.Message { return abi.Message{Role: abi.MessageUser, Content: s} }
	buildIn := func(step int, input string, history, transcript []abi.Message) abi.BuildInput {
		return abi.BuildInput{
			Run:        abi.RunView{ID: "run1", Tenant: cpTenant, Session: "s1", Step: step, Input: input, Metadata: json.RawMessage(`{"k":"v"}`)},
			History:    history,
			Transcript: transcript,
			Tools:      []abi.Tool{{Name: "calculate", Description: "Evaluate", InputSchema: json.RawMessage(`{"type":"object"}`)}},
		}
	}
	builderCalls := []cpCall{
		buildCall("step 1", buildIn(1, "What is 2+3?", nil, nil)),
		buildCall("step 2 with history", buildIn(2, "What is 2+3?",
			[]abi.Message{user("h1"), {Role: abi.MessageAssistant, Content: "h2"}, user("h3"), {Role: abi.MessageAssistant, Content: "h4"}},
			[]abi.Message{user("What is 2+3?"), {Role: abi.MessageAssistant, ToolCalls: []abi.ToolCall{{ID: "c1", Name: "calculate", Arguments: json.RawMessage(`{"expression":"2+3"}`)}}},
				{Role: abi.MessageTool, ToolCallID: "c1", Content: "5"}})),
		buildCall("no run id", buildIn(1, "", nil, nil)),
		buildCall("unicode and NUL", buildIn(1, "h\u00e9llo \u0000 \U0001F600", nil, []abi.Message{user("\u2028\u2029")})),
		buildCall("a long transcript", buildIn(3, "x", nil, func() []abi.Message {
			var m []abi.Message
			for i := 0; i < 500; i++ {
				m = append(m, user(fmt.Sprintf("message %d", i)))
			}
			return m
		}())),
	}
	prog := kernelProbePrograms()
	var probeCalls []cpCall
	for _, p := range prog {
		probeCalls = append(probeCalls, cpCall{name: p.name, export: "probe", input: p.code})
	}
	probeCalls = append(probeCalls, start("echo", tc("run1.t1.0", 1, "echo", map[string]string{"text": "probe"})))

	hostileArgs := []struct {
		tool string
		args map[string]string
	}{
		{"ok", nil}, {"not_json", nil}, {"bad_schema", nil}, {"nonzero", nil}, {"trap", nil}, {"ok", nil},
		{"huge_output", nil}, {"oom", nil}, {"loop", nil}, {"ok", nil},
		{"file_read", nil}, {"file_read", map[string]string{"path": "/proc/self/environ"}},
		{"http", map[string]string{"url": srv.url("/hello")}}, {"http", map[string]string{"url": srv.url("/big")}},
		{"http", map[string]string{"url": "http://localhost:" + srv.port + "/hello"}},
		{"kv_put", map[string]string{"key": "secret", "value": "acme-only"}}, {"kv_read", map[string]string{"key": "secret"}},
		{"kv_read", map[string]string{"key": "absent"}}, {"kv_put", map[string]string{"key": "", "value": "x"}},
		{"no_such_tool", nil},
	}
	var hostileCalls []cpCall
	for i, h := range hostileArgs {
		c := start("mode "+h.tool, tc(fmt.Sprintf("run1.t1.%d", i), 1, h.tool, h.args))
		if h.tool == "loop" || h.tool == "oom" || h.tool == "huge_output" {
			c.effect = nil // once is enough for what costs a timeout or 32 MiB
		}
		hostileCalls = append(hostileCalls, c)
	}
	for i, args := range []map[string]any{
		{"url": srv.url("/hello")}, {"url": srv.url("/hello"), "chunk": 5},
		{"url": srv.url("/big"), "count": true}, // over the limit: too_large
		{"url": "http://localhost:" + srv.port + "/hello"},
		{"stream": 1},
	} {
		hostileCalls = append(hostileCalls, start("mode http_stream", tc(fmt.Sprintf("run1.t2.%d", i), 1, "http_stream", args)))
	}

	scriptedCalls := []cpCall{
		start("model: call echo", cpModelCall("run1.m1", 1, user(`call:echo({"text":"hi"}),wire({"n":1})|answer:got $results`))),
		start("model: answer", cpModelCall("run1.m2", 1, user(`call:echo({"text":"hi"})|answer:got $results`), abi.Message{Role: abi.MessageAssistant, Content: ""}, abi.Message{Role: abi.MessageTool, ToolCallID: "x", Content: "hi"})),
		start("model: ask", cpModelCall("run1.m3", 1, user(`ask:what now?`))),
		start("model: bad script", cpModelCall("run1.m4", 1, user(`call:echo(not json)`))),
		start("model: no user message", cpModelCall("run1.m5", 1)),
		start("fail", tc("run1.t2.0", 1, "fail", nil)),
		start("flaky attempt 1", tc("run1.t2.1", 1, "flaky", nil)),
		start("flaky attempt 2", tc("run1.t2.1", 2, "flaky", nil)),
		start("block (released)", tc("run1.t2.2", 1, "block", nil)),
		start("unknown tool", tc("run1.t2.3", 1, "nope", nil)),
	}
	scriptedCalls = append(scriptedCalls, lifecycle("slow", tc("run1.t3.0", 1, "slow", map[string]string{"text": "later"}), time.Second)...)
	scriptedCalls = append(scriptedCalls, lifecycle("lost", tc("run1.t3.1", 1, "lost", nil), time.Second)...)
	scriptedCalls = append(scriptedCalls, lifecycle("echo", tc("run1.t3.2", 1, "echo", map[string]string{"text": "e"}), 0)...)

	// slow-job's calls, for its Go build and its C build alike.
	slowJobCalls := append(append(
		lifecycle("3 seconds", tc("run1.t1.0", 1, "slow_job", map[string]any{"seconds": 3, "label": "demo"}), 4*time.Second),
		lifecycle("attempt 2", tc("run1.t1.0", 2, "slow_job", map[string]any{"seconds": 10}), 11*time.Second)...),
		start("bad seconds", tc("run1.t2.0", 1, "slow_job", map[string]any{"seconds": "soon"})),
		start("negative seconds", tc("run1.t2.1", 1, "slow_job", map[string]any{"seconds": -1})),
		start("huge seconds", tc("run1.t2.2", 1, "slow_job", map[string]any{"seconds": 1e300})),
		effectCall("poll of an unknown job", abi.ExportPoll, tc("run9.t1.0", 1, "slow_job", nil)),
		effectCall("cancel of an unknown job", abi.ExportCancel, tc("run9.t1.0", 1, "slow_job", nil)),
	)

	// The scripted model's calls, for its Go build and its C build alike.
	scriptedModelCalls := append([]cpCall{
		start("arithmetic", cpModelCall("run1.m1", 1, abi.Message{Role: abi.MessageSystem, Content: "You are careful."}, user("What is (2+3)*4?"))),
		start("two sums", cpModelCall("run1.m2", 1, user("What is 2+3 and 4*5?"))),
		start("tool results", cpModelCall("run1.m3", 1, user("What is 2+3?"),
			abi.Message{Role: abi.MessageAssistant, ToolCalls: []abi.ToolCall{{ID: "call_1", Name: "calculate", Arguments: json.RawMessage(`{"expression":"2+3"}`)}}},
			abi.Message{Role: abi.MessageTool, ToolCallID: "call_1", Content: "5"})),
		start("time", cpModelCall("run1.m4", 1, user("What time is it?"))),
		start("greeting", cpModelCall("run1.m5", 1, user("hi!"))),
		start("slow job", cpModelCall("run1.m6", 1, user("run a slow job for 3 seconds"))),
		start("fallback", cpModelCall("run1.m7", 1, user("\u00bfqu\u00e9? \u0000"))),
		start("no messages", cpModelCall("run1.m8", 1)),
		start("a tool effect", tc("run1.t1.0", 1, "calculate", nil)),
	}, lifecycle("model lifecycle", cpModelCall("run1.m9", 1, user("hi")), time.Second)...)

	return []cpPlugin{
		{name: "prompt-builder", wasm: example("prompt-builder"), role: abi.RoleBuilder,
			spec: func(s *PluginSpec) {
				s.Sandbox.Config = map[string]string{"system_prompt": "Be brief.", "history_window": "2"}
			},
			calls: builderCalls, exports: []string{abi.ExportBuild}},
		{name: "prompt-builder-c", wasm: example("prompt-builder-c"), role: abi.RoleBuilder,
			spec: func(s *PluginSpec) {
				s.Sandbox.Config = map[string]string{"system_prompt": "Be brief.", "history_window": "2"}
			},
			calls: builderCalls, exports: []string{abi.ExportBuild}},
		{name: "scripted-model", wasm: example("scripted-model"), role: abi.RoleExecutor, kind: abi.KindModel,
			calls: scriptedModelCalls, exports: cpExecutorExports},
		{name: "scripted-model-c", wasm: example("scripted-model-c"), role: abi.RoleExecutor, kind: abi.KindModel,
			calls: scriptedModelCalls, exports: cpExecutorExports},
		{name: "calculator", wasm: example("calculator"), role: abi.RoleExecutor, kind: abi.KindTool, calls: calculatorCalls(t), exports: cpExecutorExports},
		{name: "calculator-c", wasm: example("calculator-c"), role: abi.RoleExecutor, kind: abi.KindTool, calls: calculatorCalls(t), exports: cpExecutorExports},
		// The AssemblyScript calculator: if it does not build, this entry
		// fails (it is part of what the paths must agree on), never skips.
		{name: "calculator-as", wasm: example("calculator-as"), role: abi.RoleExecutor, kind: abi.KindTool, calls: calculatorCalls(t), exports: cpExecutorExports},
		{name: "slow-job", wasm: example("slow-job"), role: abi.RoleExecutor, kind: abi.KindTool,
			calls: slowJobCalls, exports: cpExecutorExports},
		{name: "slow-job-c", wasm: example("slow-job-c"), role: abi.RoleExecutor, kind: abi.KindTool,
			calls: slowJobCalls, exports: cpExecutorExports},
		{name: "openai", wasm: example("openai"), role: abi.RoleExecutor, kind: abi.KindModel,
			spec: func(s *PluginSpec) {
				s.Sandbox.Config = map[string]string{"base_url": srv.url("/v1"), "model": "gpt-test", "api_key": "sk-test", "temperature": "0"}
				s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + srv.port}
			},
			calls: append([]cpCall{
				start("plain answer", cpModelCall("run1.m1", 1, user("hello"))),
				start("tool call", cpModelCall("run1.m2", 1, user("call a tool"))),
				start("server error", cpModelCall("run1.m3", 1, user("answer 500"))),
				start("garbage answer", cpModelCall("run1.m4", 1, user("answer garbage"))),
				start("a tool effect", tc("run1.t1.0", 1, "calculate", nil)),
			}, lifecycle("model lifecycle", cpModelCall("run1.m5", 1, user("hi")), time.Second)...),
			exports: cpExecutorExports},
		{name: "anthropic", wasm: example("anthropic"), role: abi.RoleExecutor, kind: abi.KindModel,
			spec: func(s *PluginSpec) {
				s.Sandbox.Config = map[string]string{"base_url": claude.URL, "model": "claude-test", "api_key": "sk-ant-test", "temperature": "0"}
				s.Sandbox.AllowedHosts = []string{claude.Addr}
			},
			calls: append([]cpCall{
				start("plain answer", cpModelCall("run1.m1", 1, user("hello"))),
				start("tool call", cpModelCall("run1.m2", 1, user("use calculate"))),
				start("tool result", cpModelCall("run1.m3", 1, user("use calculate"),
					abi.Message{Role: abi.MessageAssistant, ToolCalls: []abi.ToolCall{{ID: "toolu_2", Name: "calculate", Arguments: json.RawMessage(`{"expression":"6*7"}`)}}},
					abi.Message{Role: abi.MessageTool, ToolCallID: "toolu_2", Content: "42"})),
				start("overloaded", cpModelCall("run1.m4", 1, user("answer 529"))),
				start("a tool effect", tc("run1.t1.0", 1, "calculate", nil)),
			}, lifecycle("model lifecycle", cpModelCall("run1.m5", 1, user("hi")), time.Second)...),
			exports: cpExecutorExports},
		{name: conformance.PluginBuilder, wasm: conf(conformance.PluginBuilder), role: abi.RoleBuilder, calls: builderCalls, exports: []string{abi.ExportBuild}},
		{name: conformance.PluginExecutor, wasm: conf(conformance.PluginExecutor), role: abi.RoleExecutor, kind: abi.KindTool,
			calls: append([]cpCall{
				start("add", tc("run1.t1.0", 1, "add", map[string]int{"a": 2, "b": 3})),
				start("echo", tc("run1.t1.1", 1, "echo", map[string]string{"text": "h\u00e9llo"})),
				start("abi", tc("run1.t1.2", 1, "abi", nil)),
				{name: "clock, 90 minutes on", export: abi.ExportStart, input: effectCall("", abi.ExportStart, tc("run1.t1.3", 1, "clock", nil)).input, kind: abi.KindTool, advance: 90 * time.Minute},
				start("kv_roundtrip", tc("run1.t1.4", 1, "kv_roundtrip", map[string]string{"text": "v"})),
				start("unknown tool", tc("run1.t1.5", 1, "nope", nil)),
				start("model: add", cpModelCall("run1.m1", 1, user("please add 4 5"))),
				start("model: tool result", cpModelCall("run1.m2", 1, user("x"), abi.Message{Role: abi.MessageTool, ToolCallID: "c", Content: "9"})),
				start("model: no messages", cpModelCall("run1.m3", 1)),
				{name: "empty export", export: "empty", input: []byte(`{"abi":1}`)},
			}, lifecycle("echo", tc("run1.t2.0", 1, "echo", map[string]string{"text": "e"}), time.Second)...),
			exports: append([]string{"empty"}, cpExecutorExports...)},
		{name: conformance.PluginSlowJob, wasm: conf(conformance.PluginSlowJob), role: abi.RoleExecutor, kind: abi.KindTool,
			calls: append(append(
				lifecycle("slow 1500ms", tc("run1.t1.0", 1, "slow", map[string]int{"duration_ms": 1500}), 2*time.Second),
				lifecycle("slow default", tc("run1.t1.1", 1, "slow", nil), 500*time.Millisecond)...),
				start("other tool", tc("run1.t1.2", 1, "fast", nil)),
				effectCall("no attempt", abi.ExportPoll, tc("run1.t1.3", 0, "slow", nil)),
			),
			exports: cpExecutorExports},
		{name: conformance.PluginScripted, wasm: conf(conformance.PluginScripted), role: abi.RoleExecutor, kind: abi.KindTool,
			kv: map[string]string{"release": "1"}, calls: scriptedCalls, exports: cpExecutorExports},
		{name: conformance.PluginHostile, wasm: conf(conformance.PluginHostile), role: abi.RoleExecutor, kind: abi.KindTool,
			spec: func(s *PluginSpec) {
				// Long enough for huge_output (2 MiB through store_u64,
				// 8 bytes a host call) under -race on a loaded machine:
				// whether a slow call ends within the timeout is the
				// machine's speed, not the path's semantics. loop costs it.
				s.Limits.CallTimeout = 10 * time.Second
				s.Limits.MemoryPages = 512 // 32 MiB
				s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + srv.port}
				s.Sandbox.MaxHTTPResponseBytes = 1 << 20
			},
			calls: hostileCalls, exports: cpExecutorExports},
		{name: conformance.PluginBroken, wasm: conf(conformance.PluginBroken), role: abi.RoleExecutor, kind: abi.KindTool,
			calls: []cpCall{
				start("counter 1", tc("run1.t1.0", 1, "counter", nil)),
				start("counter 2", tc("run1.t1.0", 1, "counter", nil)),
				start("explode", tc("run1.t1.1", 1, "explode", nil)),
				start("counter after the trap", tc("run1.t1.0", 1, "counter", nil)),
				effectCall("attach", abi.ExportAttach, tc("run1.t1.2", 1, "counter", nil)),
				effectCall("cancel", abi.ExportCancel, tc("run1.t1.2", 1, "counter", nil)),
				effectCall("poll", abi.ExportPoll, tc("run1.t1.2", 1, "counter", nil)),
				start("unknown tool", tc("run1.t1.3", 1, "nope", nil)),
			},
			exports: cpExecutorExports},
		{name: conformance.PluginKernelProbe, wasm: conf(conformance.PluginKernelProbe), role: abi.RoleExecutor, kind: abi.KindTool,
			spec:  kernelProbeSpec,
			calls: probeCalls, exports: append([]string{"probe"}, cpExecutorExports...)},
	}
}

// kernelProbeSpec is the kernelprobe's spec in both tests: a config to
// read, and a call timeout short enough for the programs that spin (each
// costs it), and long enough for the others on a loaded machine under
// -race: the slowest takes a fifth of a second on one shared core.
func kernelProbeSpec(s *PluginSpec) {
	s.Limits.CallTimeout = 3 * time.Second
	s.Limits.MaxInputBytes = cpMaxInput
	s.Sandbox.Config = map[string]string{"greeting": "hello from the config", "empty": ""}
}

// The kernelprobe's encoding (conformance/plugins/kernelprobe/main.go).
const (
	kpAlloc byte = iota
	kpFree
	kpLength
	kpLengthUnsafe
	kpLoadU8
	kpLoadU64
	kpStoreU8
	kpStoreU64
	kpInputLoadU8
	kpInputLoadU64
	kpInputOffset
	kpInputLength
	kpOutputSet
	kpErrorSet
	kpErrorGet
	kpConfigGet
	kpVarGet
	kpVarSet
	kpLogInfo
	kpMemoryBytes
	kpOutputLength
	kpOutputOffset
	kpGetLogLevel
	kpBytes
	kpKVGet
	kpKVSet
	kpKVDelete
	kpEmit
	kpNowMS
	kpHTTP
	kpHTTPRequest
	kpStatus
	kpTrap
	kpLog
	kpEnd
	kpNumOps
)

// The indices of the kernelprobe's special constants.
const (
	kcMax        = 0  // 2^64-1
	kcMaxMinus8  = 1  // 2^64-8
	kcMinus12    = 2  // 2^64-12
	kc2p63       = 3  // 2^63
	kcU32Max     = 4  // 2^32-1
	kc2p32       = 5  // 2^32
	kc2p32Plus77 = 6  // 2^32+77
	kcEnd        = 7  // 1 MiB: the end of the kernel's initial memory
	kcEndMinus8  = 8  //
	kcEndMinus1  = 9  //
	kc64         = 10 //
	kc65         = 11 // the first block's header
	kc77         = 12 // the first block's data
	kcRoot       = 13 // 1
	kcPos        = 14 // 9: the root's position
	kcLen        = 15 // 17: the root's length
	kcErr        = 16 // 25: the root's error
	kcOutOff     = 17 // 49: the root's output offset
	kcLoopSize   = 18 // 0xFFFFFFF4
)

// Operands.
func kLit(v uint64) []byte {
	b := make([]byte, 9)
	binary.LittleEndian.PutUint64(b[1:], v)
	return b
}
func kSmall(v byte) []byte       { return []byte{v<<2 | 1} }
func kRef(k int, d int16) []byte { return []byte{2, byte(k), byte(uint16(d)), byte(uint16(d) >> 8)} }
func kConst(i int) []byte        { return []byte{byte(i)<<2 | 3} }
func kOp(op byte, args ...[]byte) []byte {
	b := []byte{op}
	for _, a := range args {
		b = append(b, a...)
	}
	return b
}
func kBytes(s string) []byte { return append([]byte{kpBytes, byte(len(s))}, s...) }

func kProg(ops ...[]byte) []byte { return bytes.Join(ops, nil) }

type kernelProbeProgram struct {
	name string
	code []byte
}

// kernelProbePrograms are probe programs for the edges of the kernel: the
// comment on each says what it does; result #k is op #k's.
func kernelProbePrograms() []kernelProbeProgram {
	r0 := kRef(0, 0)
	many := [][]byte{}
	for i := 0; i < 200; i++ {
		many = append(many, kOp(kpAlloc, kSmall(byte(i%64))))
	}
	many = append(many, kOp(kpMemoryBytes))
	big := kProg(kOp(kpInputLength), kOp(kpInputLoadU64, kLit(cpMaxInput-8)), kOp(kpInputLoadU8, kLit(cpMaxInput-1)), kOp(kpEnd))
	big = append(big, bytes.Repeat([]byte{0xA5}, cpMaxInput-len(big))...)
	return []kernelProbeProgram{
		{"empty program", nil},
		{"registers", kProg(kOp(kpInputLength), kOp(kpInputOffset), kOp(kpMemoryBytes), kOp(kpErrorGet), kOp(kpOutputLength), kOp(kpOutputOffset),
			kOp(kpGetLogLevel), kOp(kpNowMS), kOp(kpInputLoadU8, kSmall(0)), kOp(kpInputLoadU64, kSmall(0)),
			kOp(kpInputLoadU8, r0), kOp(kpInputLoadU8, kConst(kcMax)), kOp(kpInputLoadU64, kRef(0, -8)), kOp(kpInputLoadU64, kRef(0, -1)),
			kOp(kpInputLoadU64, kConst(kc2p32)), kOp(kpInputLoadU64, kConst(kcMax)))},
		// alloc, store and load in a block, then free it and look again.
		{"alloc store load free", kProg(kOp(kpAlloc, kSmall(16)), kOp(kpStoreU64, r0, kLit(0x1122334455667788)), kOp(kpStoreU8, kRef(0, 8), kLit(0x1AB)),
			kOp(kpLoadU64, r0), kOp(kpLoadU8, kRef(0, 8)), kOp(kpLoadU8, kRef(0, 9)), kOp(kpLength, r0), kOp(kpLengthUnsafe, r0),
			kOp(kpLoadU64, kRef(0, -12)), kOp(kpLoadU8, kRef(0, -12)), kOp(kpFree, r0), kOp(kpLength, r0), kOp(kpLengthUnsafe, r0), kOp(kpLoadU8, kRef(0, -12)),
			kOp(kpLength, kRef(0, 1)), kOp(kpLengthUnsafe, kRef(0, 1)))},
		{"alloc 0 and 1", kProg(kOp(kpAlloc, kSmall(0)), kOp(kpAlloc, kSmall(1)), kOp(kpLength, kRef(1, 0)), kOp(kpMemoryBytes))},
		{"alloc 2^64-1", kProg(kOp(kpAlloc, kConst(kcMax)), kOp(kpLength, r0), kOp(kpLengthUnsafe, r0), kOp(kpAlloc, kSmall(8)), kOp(kpLength, kRef(3, 0)), kOp(kpMemoryBytes))},
		{"alloc 2^64-12", kProg(kOp(kpAlloc, kConst(kcMinus12)), kOp(kpLength, r0), kOp(kpAlloc, kSmall(8)), kOp(kpLength, kRef(2, 0)))},
		{"alloc 2^64-8", kProg(kOp(kpAlloc, kConst(kcMaxMinus8)), kOp(kpAlloc, kSmall(8)), kOp(kpLength, kRef(1, 0)))},
		{"alloc 2^32", kProg(kOp(kpAlloc, kConst(kc2p32)), kOp(kpAlloc, kConst(kcU32Max)), kOp(kpAlloc, kSmall(8)), kOp(kpMemoryBytes))},
		{"alloc 2^63", kProg(kOp(kpAlloc, kConst(kc2p63)), kOp(kpAlloc, kSmall(8)))},
		{"alloc 2^40", kProg(kOp(kpAlloc, kLit(1<<40)), kOp(kpAlloc, kSmall(8)), kOp(kpMemoryBytes))},
		{"alloc over the memory cap", kProg(kOp(kpAlloc, kLit(100<<20)), kOp(kpMemoryBytes), kOp(kpAlloc, kSmall(8)))},
		{"alloc over the memory cap, then trap", kProg(kOp(kpAlloc, kLit(100<<20)), kOp(kpTrap, kSmall(0)))},
		// Each of these traps, so the next runs in a fresh instance, whose
		// kernel memory is still its initial 1 MiB.
		{"load_u8 at the end", kProg(kOp(kpLoadU8, kConst(kcEnd)))},
		{"load_u64 past the end", kProg(kOp(kpLoadU64, kLit(16<<16-7)))},
		{"store_u8 at the end", kProg(kOp(kpStoreU8, kConst(kcEnd), kSmall(1)))},
		{"store_u64 past the end", kProg(kOp(kpStoreU64, kLit(16<<16-4), kSmall(1)))},
		{"input_load_u64 past the end", kProg(kOp(kpInputLoadU64, kLit(1<<20)))},
		{"alloc that grows the memory", kProg(kOp(kpAlloc, kLit(3<<20)), kOp(kpMemoryBytes), kOp(kpStoreU64, kRef(0, 100), kLit(0xFEEDFACE)),
			kOp(kpLoadU64, kRef(0, 100)), kOp(kpLength, r0), kOp(kpOutputSet, r0, kLit(128)))},
		// The bump allocator is full: the next alloc reuses a freed block,
		// split.
		{"reuse of a freed block", kProg(kOp(kpAlloc, kLit(60000)), kOp(kpFree, r0), kOp(kpAlloc, kLit(10000)), kOp(kpLength, kRef(2, 0)),
			kOp(kpAlloc, kLit(5000)), kOp(kpLength, kRef(4, 0)), kOp(kpLength, r0), kOp(kpAlloc, kLit(40000)), kOp(kpMemoryBytes))},
		{"free edges", kProg(kOp(kpFree, kSmall(0)), kOp(kpFree, kSmall(1)), kOp(kpFree, kConst(kc64)), kOp(kpFree, kConst(kc77)), kOp(kpFree, kConst(kcEnd)),
			kOp(kpFree, kConst(kcMax)), kOp(kpFree, kConst(kc2p32Plus77)), kOp(kpInputLength), kOp(kpAlloc, kSmall(8)), kOp(kpLength, kRef(8, 0)))},
		{"double free", kProg(kOp(kpAlloc, kSmall(16)), kOp(kpFree, r0), kOp(kpFree, r0), kOp(kpAlloc, kSmall(16)), kOp(kpAlloc, kSmall(16)),
			kOp(kpLength, kRef(3, 0)), kOp(kpLength, kRef(4, 0)), kOp(kpFree, kRef(3, 0)), kOp(kpFree, kRef(3, 0)), kOp(kpLength, kRef(3, 0)))},
		{"host calls on freed blocks", kProg(kBytes("key"), kBytes("val"), kOp(kpFree, r0), kOp(kpKVSet, r0, kRef(1, 0)), kOp(kpKVGet, r0),
			kOp(kpKVDelete, r0), kOp(kpEmit, kRef(1, 0)), kOp(kpConfigGet, r0), kOp(kpVarGet, r0), kOp(kpLogInfo, r0), kOp(kpHTTP, r0))},
		{"host calls on offset 0", kProg(kOp(kpKVGet, kSmall(0)), kOp(kpKVSet, kSmall(0), kSmall(0)), kOp(kpKVDelete, kSmall(0)), kOp(kpEmit, kSmall(0)),
			kOp(kpConfigGet, kSmall(0)), kOp(kpVarGet, kSmall(0)), kOp(kpVarSet, kSmall(0), kSmall(0)), kOp(kpLogInfo, kSmall(0)), kOp(kpHTTP, kSmall(0)),
			kOp(kpLength, kRef(8, 0)), kOp(kpOutputSet, kRef(8, 0), kRef(9, 0)))},
		{"agenthost calls out of range", kProg(kOp(kpKVGet, kConst(kcMax)), kOp(kpKVGet, kConst(kcEnd)), kOp(kpKVSet, kConst(kc2p32Plus77), kConst(kc2p32Plus77)),
			kOp(kpEmit, kConst(kcEndMinus1)), kOp(kpEmit, kLit(12345)), kOp(kpKVDelete, kConst(kcMax)), kOp(kpKVSet, kLit(1<<33), kConst(kcMaxMinus8)),
			kOp(kpHTTP, kConst(kcMax)), kOp(kpLength, kRef(7, 0)), kOp(kpOutputSet, kRef(7, 0), kRef(8, 0)))},
		{"agenthost calls inside blocks", kProg(kBytes("k-inside"), kBytes("v-inside"), kOp(kpKVSet, kRef(0, 1), kRef(1, 1)), kOp(kpKVSet, kRef(0, -12), kRef(1, 2)),
			kOp(kpEmit, kRef(1, -4)))},
		{"config_get out of range", kProg(kOp(kpConfigGet, kConst(kcMax)))},
		{"var_get out of range", kProg(kOp(kpVarGet, kConst(kc2p32)))},
		{"var_set out of range", kProg(kBytes("v"), kOp(kpVarSet, kConst(kcMax), r0))},
		{"var_set value out of range", kProg(kBytes("v"), kOp(kpVarSet, r0, kConst(kcEnd+1)))},
		{"log_info out of range", kProg(kOp(kpLogInfo, kConst(kcMax)))},
		{"log_debug out of range", kProg(kOp(kpLog, kSmall(1), kConst(kc2p32)))},
		{"raw KV round trip", kProg(kBytes("k1"), kBytes("v1"), kOp(kpKVSet, r0, kRef(1, 0)), kBytes("k1"), kOp(kpKVGet, kRef(3, 0)), kOp(kpLength, kRef(4, 0)),
			kBytes("k1"), kOp(kpKVDelete, kRef(6, 0)), kBytes("k1"), kOp(kpKVGet, kRef(8, 0)), kOp(kpLoadU8, kRef(4, 0)),
			kBytes("kept"), kBytes("a value left behind"), kOp(kpKVSet, kRef(11, 0), kRef(12, 0)), kOp(kpOutputSet, kRef(4, 0), kRef(5, 0)))},
		{"raw KV empty value deletes", kProg(kBytes("kept"), kOp(kpKVSet, r0, kSmall(0)), kBytes("kept"), kOp(kpKVGet, kRef(2, 0)))},
		{"raw emit", kProg(kBytes(`{"type":"progress","message":"raw emit","data":{"n":1}}`), kOp(kpEmit, r0), kBytes(`{"type":""}`), kOp(kpEmit, kRef(2, 0)),
			kBytes(`not json`), kOp(kpEmit, kRef(4, 0)), kBytes(`{"type":"progress","message":"\u0000\xff"}`), kOp(kpEmit, kRef(6, 0)), kOp(kpEmit, r0))},
		{"config and vars", kProg(kBytes("greeting"), kOp(kpConfigGet, r0), kOp(kpLength, kRef(1, 0)), kBytes("missing"), kOp(kpConfigGet, kRef(3, 0)),
			kBytes("v"), kBytes("value-1"), kOp(kpVarSet, kRef(5, 0), kRef(6, 0)), kBytes("v"), kOp(kpVarGet, kRef(8, 0)), kOp(kpLength, kRef(9, 0)),
			kBytes("empty"), kOp(kpConfigGet, kRef(11, 0)), kOp(kpOutputSet, kRef(9, 0), kRef(10, 0)))},
		// The same instance: the var set by the last program is there.
		{"vars persist in the instance", kProg(kBytes("v"), kOp(kpVarGet, r0), kOp(kpLength, kRef(1, 0)), kOp(kpOutputSet, kRef(1, 0), kRef(2, 0)))},
		{"var delete", kProg(kBytes("v"), kOp(kpVarSet, r0, kSmall(0)), kBytes("v"), kOp(kpVarGet, kRef(2, 0)))},
		{"var store full", kProg(kBytes("big"), kOp(kpAlloc, kLit(70000)), kOp(kpVarSet, r0, kRef(1, 0)))},
		{"vars after a trap", kProg(kBytes("v"), kOp(kpVarGet, r0))},
		{"log levels", kProg(kBytes("trace"), kOp(kpLog, kSmall(0), r0), kBytes("debug"), kOp(kpLog, kSmall(1), kRef(2, 0)), kBytes("info"), kOp(kpLog, kSmall(2), kRef(4, 0)),
			kBytes("warn"), kOp(kpLog, kSmall(3), kRef(6, 0)), kBytes("error"), kOp(kpLog, kSmall(4), kRef(8, 0)), kBytes("info2"), kOp(kpLogInfo, kRef(10, 0)),
			kOp(kpLog, kSmall(4), kSmall(0)), kOp(kpLogInfo, kRef(10, 0)))},
		{"error_set with a status", kProg(kBytes("probe says no"), kOp(kpErrorSet, r0), kOp(kpStatus, kSmall(3)))},
		{"error_set with status 0", kProg(kBytes("an error, but status 0"), kOp(kpErrorSet, r0))},
		{"error_set then output", kProg(kBytes("an error"), kOp(kpErrorSet, r0), kOp(kpErrorGet))},
		{"error_set to garbage", kProg(kOp(kpErrorSet, kLit(100)), kOp(kpErrorGet), kOp(kpStatus, kSmall(1)))},
		{"error_set out of range", kProg(kOp(kpErrorSet, kConst(kcMax)), kOp(kpErrorGet), kOp(kpErrorSet, kConst(kc64)), kOp(kpErrorGet),
			kOp(kpErrorSet, kConst(kc65)), kOp(kpErrorGet), kOp(kpErrorSet, kConst(kc2p32Plus77)), kOp(kpErrorGet), kOp(kpStatus, kSmall(1)))},
		{"error_set to the input", kProg(kOp(kpInputOffset), kOp(kpErrorSet, r0), kOp(kpStatus, kSmall(2)))},
		{"error_set to a freed block", kProg(kBytes("freed message"), kOp(kpFree, r0), kOp(kpErrorSet, r0), kOp(kpStatus, kSmall(2)))},
		{"error_set then cleared", kProg(kBytes("x"), kOp(kpErrorSet, r0), kOp(kpErrorSet, kSmall(0)), kOp(kpStatus, kSmall(1)))},
		{"error_set huge message", kProg(kOp(kpAlloc, kLit(50000)), kOp(kpStoreU64, r0, kLit(0x4141414141414141)), kOp(kpErrorSet, r0), kOp(kpStatus, kSmall(1)))},
		{"output_set past the end", kProg(kOp(kpAlloc, kSmall(16)), kOp(kpOutputSet, r0, kConst(kcMax)), kOp(kpOutputLength), kOp(kpOutputSet, r0, kLit(1<<20)),
			kOp(kpOutputLength), kOp(kpOutputSet, kConst(kcEndMinus8), kSmall(8)), kOp(kpOutputLength), kOp(kpOutputSet, r0, kLit(60000)))},
		{"output_set wrapping", kProg(kOp(kpOutputSet, kConst(kc77), kConst(kcMax)))},
		{"output_set into the root", kProg(kOp(kpOutputSet, kSmall(1), kSmall(60)))},
		{"output_set over max_output_bytes", kProg(kOp(kpAlloc, kLit(2<<20)), kOp(kpOutputSet, r0, kLit(1<<20+1)))},
		{"output_set at max_output_bytes", kProg(kOp(kpAlloc, kLit(2<<20)), kOp(kpOutputSet, r0, kLit(1<<20)))},
		{"output_set twice", kProg(kBytes("first"), kOp(kpOutputSet, r0, kSmall(5)), kOp(kpStoreU8, r0, kLit('F')), kOp(kpOutputSet, r0, kSmall(5)))},
		{"output_set of the input", kProg(kOp(kpInputOffset), kOp(kpInputLength), kOp(kpOutputSet, r0, kRef(1, 0)))},
		{"load edges", kProg(kOp(kpLoadU8, kSmall(0)), kOp(kpLoadU8, kConst(kc64)), kOp(kpLoadU8, kConst(kcEndMinus1)), kOp(kpLoadU64, kSmall(0)),
			kOp(kpLoadU64, kConst(kcEndMinus8)), kOp(kpLoadU64, kConst(kc2p32Plus77)), kOp(kpLoadU8, kConst(kc2p32Plus77)), kOp(kpLoadU8, kConst(kcMax)),
			kOp(kpLoadU64, kConst(kcRoot)), kOp(kpLengthUnsafe, kConst(kcMax)), kOp(kpLengthUnsafe, kConst(kc2p32Plus77)), kOp(kpLength, kConst(kcMax)),
			kOp(kpLength, kConst(kcEnd)), kOp(kpLengthUnsafe, kConst(kcEnd)), kOp(kpLengthUnsafe, kConst(kc64)), kOp(kpLengthUnsafe, kSmall(12)))},
		{"load_u64 at 2^64-1", kProg(kOp(kpLoadU64, kConst(kcMax)))},
		{"store edges", kProg(kOp(kpStoreU8, kSmall(0), kSmall(1)), kOp(kpStoreU8, kConst(kcMax), kSmall(1)), kOp(kpStoreU8, kConst(kcEndMinus1), kLit(0x55)),
			kOp(kpLoadU8, kConst(kcEndMinus1)), kOp(kpStoreU64, kConst(kcEndMinus8), kLit(0x0102030405060708)), kOp(kpLoadU64, kConst(kcEndMinus8)),
			kOp(kpStoreU64, kConst(kc2p32Plus77), kLit(0xDEADBEEF)), kOp(kpLoadU64, kConst(kc77)), kOp(kpStoreU8, kConst(kc2p32Plus77), kSmall(7)))},
		{"input_load_u64 wrapping", kProg(kOp(kpInputLoadU64, kConst(kcMinus12)), kOp(kpInputLoadU64, kConst(kcU32Max)))},
		// Corrupting the allocator's root and headers with store_u64, which
		// has no lower bound.
		{"corrupt root: position", kProg(kOp(kpStoreU64, kConst(kcPos), kLit(1<<40)), kOp(kpAlloc, kSmall(8)), kOp(kpLength, kRef(1, 0)), kOp(kpMemoryBytes))},
		{"corrupt root: position past the memory", kProg(kOp(kpStoreU64, kConst(kcPos), kLit(3<<20)), kOp(kpAlloc, kSmall(8)))},
		{"corrupt root: length", kProg(kOp(kpStoreU64, kConst(kcLen), kSmall(0)), kOp(kpAlloc, kSmall(8)), kOp(kpStoreU64, kConst(kcLen), kSmall(40)),
			kOp(kpAlloc, kLit(1000)), kOp(kpMemoryBytes), kOp(kpLength, kRef(3, 0)))},
		{"corrupt root: error", kProg(kOp(kpStoreU64, kConst(kcErr), kConst(kc77)), kOp(kpStatus, kSmall(1)))},
		{"corrupt root: output", kProg(kOp(kpStoreU64, kConst(kcOutOff), kConst(kc77)), kOp(kpStoreU64, kLit(57), kSmall(20)), kOp(kpErrorSet, kSmall(0)))},
		{"corrupt root: output past the memory", kProg(kOp(kpStoreU64, kConst(kcOutOff), kConst(kcEndMinus8)), kOp(kpStoreU64, kLit(57), kSmall(20)), kOp(kpErrorSet, kSmall(0)))},
		{"corrupt root: uninitialised", kProg(kOp(kpStoreU8, kSmall(1), kSmall(0)), kOp(kpStoreU64, kLit(1), kSmall(0)), kOp(kpAlloc, kSmall(8)), kOp(kpInputLength), kOp(kpMemoryBytes))},
		{"corrupt header: a block swallows the next", kProg(kOp(kpAlloc, kSmall(32)), kOp(kpAlloc, kSmall(32)), kOp(kpStoreU64, kRef(0, -8), kLit(32<<32|76)),
			kOp(kpLength, kRef(1, 0)), kOp(kpLength, r0), kOp(kpFree, kRef(1, 0)), kOp(kpLengthUnsafe, kRef(1, 0)), kOp(kpAlloc, kSmall(8)))},
		{"corrupt header: used past the block", kProg(kOp(kpAlloc, kSmall(16)), kOp(kpStoreU64, r0, kLit(0x4141414141414141)), kBytes("spill"),
			kOp(kpStoreU64, kRef(0, -8), kLit(300<<32|16)), kOp(kpLength, r0), kOp(kpKVSet, kRef(2, 0), r0), kBytes("spill"),
			kOp(kpKVGet, kRef(6, 0)), kOp(kpLength, kRef(7, 0)), kOp(kpOutputSet, kRef(7, 0), kRef(8, 0)))},
		{"corrupt header: used past the memory", kProg(kOp(kpAlloc, kSmall(16)), kOp(kpStoreU64, kRef(0, -8), kLit(0xFFFFFFF0<<32|16)), kOp(kpLength, r0),
			kBytes("key"), kOp(kpKVSet, kRef(3, 0), r0))},
		{"corrupt header: status 0 is taken whatever its size", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpStoreU8, kRef(0, -12), kSmall(0)), kOp(kpLength, r0),
			kOp(kpAlloc, kLit(65000)), kOp(kpLength, kRef(3, 0)), kOp(kpMemoryBytes))},
		{"corrupt header: the first block", kProg(kOp(kpStoreU64, kLit(65+4), kLit(0)), kOp(kpAlloc, kSmall(8)), kOp(kpLength, kRef(1, 0)), kOp(kpInputLength))},
		// A block size of -12 makes the walk a cycle: both paths spin
		// until the call timeout.
		{"corrupt header: a cycle", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpStoreU64, kRef(0, -8), kLit(8<<32|0xFFFFFFF4)), kOp(kpLength, kLit(999999)))},
		{"after the timeout", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpLength, r0))},
		// The agenthost host functions walk the blocks too (to read an
		// argument, to place a result): a cycle there ends at the call
		// timeout on both paths, as plugin_timeout. (go-sdk's own
		// config_get, var_*, log_* and http_request walk under a
		// background context, so on the reference path they never end:
		// docs/DESIGN.md §10; those are not compared.)
		{"a cycle, then kv_get", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpStoreU64, kRef(0, -8), kLit(8<<32|0xFFFFFFF4)), kOp(kpKVGet, kLit(999999)))},
		{"a cycle, then kv_set", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpStoreU64, kRef(0, -8), kLit(8<<32|0xFFFFFFF4)), kOp(kpKVSet, kLit(999999), kLit(999999)))},
		{"a cycle, then emit", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpStoreU64, kRef(0, -8), kLit(8<<32|0xFFFFFFF4)), kOp(kpEmit, kLit(999999)))},
		{"KV: a 5000-byte value", kProg(kBytes("big"), kOp(kpAlloc, kLit(5000)), kOp(kpKVSet, r0, kRef(1, 0)))},
		// kv_get reads its key before the cycle; placing the 5000-byte
		// value walks into it: the call's timeout, not a full memory.
		{"kv_get whose result walks a cycle", kProg(kBytes("big"), kOp(kpAlloc, kLit(65000)), kOp(kpStoreU64, kRef(1, -8), kLit(8<<32|0xFFFFFFF4)), kOp(kpKVGet, r0))},
		{"agenthost_http raw", kProg(kBytes(`{"method":"GET","url":"http://127.0.0.1:1/"}`), kOp(kpHTTP, r0), kOp(kpLength, kRef(1, 0)),
			kBytes(`not json`), kOp(kpHTTP, kRef(3, 0)), kOp(kpOutputSet, kRef(1, 0), kRef(2, 0)))},
		{"extism http_request", kProg(kBytes(`{"url":"http://example.com/"}`), kOp(kpHTTPRequest, r0, kSmall(0)))},
		{"extism http_request out of range", kProg(kOp(kpHTTPRequest, kConst(kcMax), kConst(kcMax)))},
		{"status without an error", kProg(kOp(kpStatus, kSmall(7)))},
		{"status -1", kProg(kOp(kpStatus, kConst(kcMax)))},
		{"status 2^32 (0 as an i32)", kProg(kOp(kpStatus, kConst(kc2p32)))},
		{"trap: out-of-bounds load", kProg(kOp(kpAlloc, kSmall(8)), kOp(kpTrap, kSmall(0)))},
		{"trap: Go panic", kProg(kBytes("x"), kOp(kpTrap, kSmall(1)))},
		{"200 allocs", kProg(many...)},
		{"truncated op", kProg(kOp(kpAlloc, kSmall(8)), []byte{kpStoreU64, 0, 1, 2})},
		{"end, then data", kProg(kOp(kpInputLength), kOp(kpEnd), []byte{kpTrap, 1})},
		{"program at max_input_bytes", big},
	}
}

// FuzzHostFunctionBounds runs fuzzed kernelprobe programs through both
// call paths: the host must never panic, both paths must give the same
// class, output and words, and every failure must be one of the classes a
// plugin's own misuse of its memory can earn. Each input runs on a fresh
// instance on each path (the idle one is evicted first), so that a failure
// reproduces from its input alone.
//
// The classes seen: plugin_trap, plugin_protocol, plugin_timeout (a block
// walk corrupted into a cycle), plugin_output_too_large, and plugin_oom (an
// alloc past the memory cap, refused, then a trap).
func FuzzHostFunctionBounds(f *testing.F) {
	for _, p := range kernelProbePrograms() {
		if len(p.code) < 4096 {
			f.Add(p.code)
		}
	}
	native, sdk := newCPSide(f, CallPathNative, nil), newCPSide(f, CallPathSDK, nil)
	path, err := conformance.BuildPlugin(conformance.PluginKernelProbe)
	if err != nil {
		f.Fatal(err)
	}
	spec := PluginSpec{Name: conformance.PluginKernelProbe, Path: path, Role: abi.RoleExecutor}
	kernelProbeSpec(&spec)
	var plugins [2]*Plugin
	for i, sd := range []*cpSide{native, sdk} {
		if plugins[i], err = sd.h.Load(context.Background(), spec); err != nil {
			f.Fatal(err)
		}
	}
	allowed := map[string]bool{
		string(abi.ClassPluginTrap): true, string(abi.ClassPluginProtocol): true, string(abi.ClassPluginTimeout): true,
		string(abi.ClassPluginOutputTooBig): true, string(abi.ClassPluginOOM): true,
	}
	var seenMu sync.Mutex
	seen := map[string]int{}
	f.Cleanup(func() {
		var cs []string
		for c, n := range seen {
			cs = append(cs, fmt.Sprintf("%s: %d", c, n))
		}
		sort.Strings(cs)
		f.Logf("classes seen: %s", strings.Join(cs, ", "))
	})
	f.Fuzz(func(t *testing.T, code []byte) {
		if len(code) > cpMaxInput {
			code = code[:cpMaxInput] // longer is refused before any call
		}
		var res [2]cpResult
		var wg sync.WaitGroup
		for i, sd := range []*cpSide{native, sdk} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dropIdle(plugins[i], cpTenant)
				// Within 5 s when fuzzing: the fuzzing engine takes a
				// worker silent for 10 s for a crash, and loses what it
				// was running. The seeds (make test, -race, a loaded
				// machine) get the watchdog's margin instead.
				limit := watchdog(plugins[i])
				if fuzzing() {
					limit = 5 * time.Second
				}
				res[i], _ = sd.doWithin(context.Background(), plugins[i], cpCall{name: "fuzz", export: "probe", input: code}, limit)
			}()
		}
		wg.Wait()
		if d := res[0].differs(res[1]); d != "" {
			t.Fatalf("program %x: the paths differ in %s\n\tnative:     %s\n\textism-sdk: %s", code, d, res[0], res[1])
		}
		for i, r := range res {
			if r.class != "" && !allowed[r.class] {
				t.Errorf("program %x: %s path: class %s, not one a plugin's memory misuse may earn: %s", code, []CallPath{CallPathNative, CallPathSDK}[i], r.class, r.err)
			}
			// A Go runtime error in a host function (an index out of
			// range in the kernel) is turned into a trap by wazero: the
			// class alone would hide it.
			if strings.Contains(r.err, "runtime error") {
				t.Errorf("program %x: %s path: a host function panicked: %s", code, []CallPath{CallPathNative, CallPathSDK}[i], r.err)
			}
		}
		seenMu.Lock()
		seen[res[0].class]++
		seenMu.Unlock()
	})
}

// fuzzing reports whether the test binary runs the fuzzing engine
// (-test.fuzz), not only the seed corpus.
func fuzzing() bool {
	f := flag.Lookup("test.fuzz")
	return f != nil && f.Value.String() != ""
}

// dropIdle closes the tenant's idle instances, so that the next call gets a
// fresh one.
func dropIdle(p *Plugin, tenant string) {
	pl, err := p.pool(tenant)
	if err != nil {
		return
	}
	for _, in := range pl.idleSnapshot() {
		pl.evict(context.Background(), in.in)
	}
}

// TestStreamedDeltasCompareByTheAnswerTheyMake checks mergeDeltas: the
// same answer cut into deltas two ways compares equal; another answer, or
// the same pieces from two attempts, does not.
func TestStreamedDeltasCompareByTheAnswerTheyMake(t *testing.T) {
	scope := runtime.EmitScope{Tenant: "acme", Session: "s1", RunID: "run1", EffectID: "run1.m5", Plugin: "anthropic", Attempt: 1}
	delta := func(seq int64, attempt int, d abi.ModelDelta) emitted {
		s := scope
		s.DeltaSeq, s.Attempt = seq, attempt
		return emitted{scope: s, ev: abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &d}}
	}
	progress := emitted{scope: scope, ev: abi.EmitEvent{Type: "progress", Message: "working"}}
	render := func(evs []emitted) []string {
		sd := &cpSide{env: &env{sink: &recordSink{events: evs}}}
		return sd.events()
	}
	oneRead := render([]emitted{progress,
		delta(1, 1, abi.ModelDelta{Text: "hello from claude-test", ToolCalls: []abi.ToolCallDelta{{Index: 0, ID: "c1", Name: "calculate", Arguments: `{"expression":"6*7"}`}}})})
	twoReads := render([]emitted{progress,
		delta(1, 1, abi.ModelDelta{Text: "hello from claude-te", ToolCalls: []abi.ToolCallDelta{{Index: 0, ID: "c1", Name: "calculate", Arguments: `{"expression":`}}}),
		delta(2, 1, abi.ModelDelta{Text: "st", ToolCalls: []abi.ToolCallDelta{{Index: 0, Arguments: `"6*7"}`}}})})
	if !slices.Equal(oneRead, twoReads) {
		t.Fatalf("one answer cut two ways compares unequal:\n\t%q\n\t%q", oneRead, twoReads)
	}
	other := render([]emitted{progress, delta(1, 1, abi.ModelDelta{Text: "hello from claude-tess"})})
	if slices.Equal(oneRead, other) {
		t.Fatalf("another answer compares equal: %q", other)
	}
	attempts := render([]emitted{progress, delta(1, 1, abi.ModelDelta{Text: "hello from claude-te"}), delta(1, 2, abi.ModelDelta{Text: "st"})})
	if len(attempts) != 3 {
		t.Fatalf("the deltas of two attempts were merged: %q", attempts)
	}
}
