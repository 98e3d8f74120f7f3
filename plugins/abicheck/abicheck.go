// Package abicheck checks one plugin .wasm against ABI v1 (docs/ABI.md):
// it calls the plugin the way the host does and checks every reply. It is
// what `agenthost plugin verify` runs, and what the tests run on every
// example and conformance plugin.
//
// It takes the plugin through the Plugin interface, which the caller
// implements with host/ (agenthost plugin verify, and the tests), and it
// reports through its own Reporter, not *testing.T, so that the agenthost
// binary runs it without linking package testing (docs/DESIGN.md §2).
// conformance.PluginSuite runs it under go test.
package abicheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Plugin is the plugin under test, as the caller's host runs it.
type Plugin interface {
	// Module reports what the module exports and imports, read without
	// running it, and whether the host refused to load it.
	Module() Module
	// Call runs one export with a raw input, under the plugin's limits, and
	// returns its raw output. A failure that is the plugin's (a trap, a
	// timeout, running out of memory, a non-zero status …) is a
	// *runtime.PluginError carrying its class.
	Call(ctx context.Context, export string, input []byte) ([]byte, error)
	// MemoryBytes is the linear memory the plugin's live instances hold.
	MemoryBytes() int64
}

// Module is what the caller's host learnt of the module before running it.
type Module struct {
	// Markers are the ABI versions of the module's agenthost_abi_vN
	// exports.
	Markers []int
	// LoadError is the host's refusal of the module (no marker, an import
	// it does not offer, a describe it cannot accept …), or nil. Nothing is
	// called when it is set.
	LoadError error
}

// Limits are the limits the plugin runs under, as the caller configured
// them.
type Limits struct {
	CallTimeout time.Duration
	MemoryPages uint32
}

// Options tune a run of the suite.
type Options struct {
	// Role is the role the plugin must report; "" takes describe's.
	Role abi.Role
	// Tool restricts the tool checks to one tool, called with Args (an
	// empty object, or arguments derived from its input_schema, when Args
	// is empty).
	Tool string
	Args json.RawMessage
	// Limits are the configured limits; calls are timed and the memory
	// measured against them.
	Limits Limits
	// SlowFraction: a call slower than this fraction of the call timeout
	// is reported as a warning (default 0.5).
	SlowFraction float64
}

// Verdict is a check's result.
type Verdict string

// Verdicts.
const (
	Pass Verdict = "PASS"
	Fail Verdict = "FAIL"
	Warn Verdict = "WARN"
)

// Result is one check's outcome and why.
type Result struct {
	Check   string
	Verdict Verdict
	// Class is the error class of a FAIL (abi.ClassPluginProtocol for a
	// reply that breaks the ABI, the call's class for a call that
	// failed); empty for PASS and WARN.
	Class  abi.ErrorClass
	Detail string
}

func (r Result) String() string {
	if r.Class != "" {
		return fmt.Sprintf("%s  %s (%s): %s", r.Verdict, r.Check, r.Class, r.Detail)
	}
	return fmt.Sprintf("%s  %s: %s", r.Verdict, r.Check, r.Detail)
}

// Reporter receives each result as soon as its check ends.
type Reporter interface {
	Report(Result)
}

// Summary counts the results of a run.
type Summary struct {
	Passed, Failed, Warned int
}

// OK reports whether no check failed.
func (s Summary) OK() bool { return s.Failed == 0 }

// Recorder is a Reporter that keeps every result.
type Recorder struct{ Results []Result }

// Report implements Reporter.
func (r *Recorder) Report(res Result) { r.Results = append(r.Results, res) }

// Names of the checks, for callers that look for one.
const (
	CheckMarker     = "marker"
	CheckDescribe   = "describe"
	CheckBuild      = "build reply"
	CheckStart      = "start reply"
	CheckReplay     = "replay is idempotent"
	CheckAttach     = "attach on an unknown effect"
	CheckCancel     = "cancel on an unknown effect"
	CheckMalformed  = "malformed input"
	CheckCallTime   = "call time"
	CheckMemory     = "memory"
	CheckAttachDecl = "attach declared"
)

type suite struct {
	p       Plugin
	opts    Options
	r       Reporter
	sum     Summary
	slowest time.Duration
	slowOp  string
	seq     int
}

// Run runs every check on p and reports each result to r.
func Run(ctx context.Context, p Plugin, opts Options, r Reporter) Summary {
	if opts.SlowFraction <= 0 {
		opts.SlowFraction = 0.5
	}
	s := &suite{p: p, opts: opts, r: r}
	s.run(ctx)
	return s.sum
}

// report reports a PASS or a WARN; fail reports a FAIL.
func (s *suite) report(check string, v Verdict, format string, args ...any) {
	switch v {
	case Pass:
		s.sum.Passed++
	case Warn:
		s.sum.Warned++
	default:
		panic("abicheck: report takes PASS or WARN; a FAIL goes through fail, with its class")
	}
	s.r.Report(Result{Check: check, Verdict: v, Detail: fmt.Sprintf(format, args...)})
}

// fail reports a FAIL of class.
func (s *suite) fail(check string, class abi.ErrorClass, format string, args ...any) {
	s.sum.Failed++
	s.r.Report(Result{Check: check, Verdict: Fail, Class: class, Detail: fmt.Sprintf(format, args...)})
}

// classOrProtocol is the class of a refusal to load: the plugin's, or
// plugin_protocol for a module the host refuses as not keeping the ABI.
func classOrProtocol(err error) abi.ErrorClass {
	var pe *runtime.PluginError
	if errors.As(err, &pe) && pe.Class != "" {
		return pe.Class
	}
	return abi.ClassPluginProtocol
}

// classOf is the error class of a failed call: the plugin's, or
// plugin_failed for an error the host did not classify.
func classOf(err error) abi.ErrorClass {
	var pe *runtime.PluginError
	if errors.As(err, &pe) && pe.Class != "" {
		return pe.Class
	}
	return abi.ClassPluginFailed
}

func (s *suite) run(ctx context.Context) {
	m := s.p.Module()
	if slices.Contains(m.Markers, abi.Version) {
		s.report(CheckMarker, Pass, "exports %s", abi.Marker)
	} else {
		found := "no marker"
		if len(m.Markers) > 0 {
			found = "only markers for ABI " + fmt.Sprint(m.Markers)
		}
		s.fail(CheckMarker, abi.ClassPluginProtocol, "exports %s, not %s: export the function %s (no parameters, no results)", found, abi.Marker, abi.Marker)
	}
	if m.LoadError != nil {
		s.fail("load", classOrProtocol(m.LoadError), "the host refuses the module, so nothing else can be checked: %v", m.LoadError)
		return
	}
	d, ok := s.describe(ctx)
	if !ok {
		return
	}
	if d.Role == abi.RoleBuilder {
		s.build(ctx)
	} else {
		s.executor(ctx, d)
	}
	s.malformed(ctx, d.Role)
	s.timing()
	s.memory()
}

// call runs one export, timing it; a failure of the plugin's is reported
// under check, by its class, and ok is false.
func (s *suite) call(ctx context.Context, check, export string, input []byte) ([]byte, bool) {
	out, elapsed, err := s.rawCall(ctx, export, input)
	if elapsed > s.slowest {
		s.slowest, s.slowOp = elapsed, export
	}
	if err != nil {
		s.fail(check, classOf(err), "%s", describeErr(export, err))
		return nil, false
	}
	return out, true
}

func (s *suite) rawCall(ctx context.Context, export string, input []byte) ([]byte, time.Duration, error) {
	budget := 2*s.opts.Limits.CallTimeout + 10*time.Second
	cctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	start := time.Now()
	out, err := s.p.Call(cctx, export, input)
	return out, time.Since(start), err
}

func describeErr(export string, err error) string {
	var pe *runtime.PluginError
	if errors.As(err, &pe) {
		what := map[abi.ErrorClass]string{
			abi.ClassPluginTrap:         "the plugin trapped",
			abi.ClassPluginTimeout:      "the call ran past the call timeout",
			abi.ClassPluginOOM:          "the plugin ran out of memory",
			abi.ClassPluginOutputTooBig: "the output is over max_output_bytes",
			abi.ClassPluginProtocol:     "the plugin returned an error",
			abi.ClassPluginDenied:       "the sandbox refused the plugin something",
			abi.ClassLimitExceeded:      "a limit was exceeded",
		}[pe.Class]
		if what == "" {
			what = "the call failed"
		}
		return fmt.Sprintf("%s: %s: %v", export, what, pe.Err)
	}
	return fmt.Sprintf("%s: %v", export, err)
}

func (s *suite) describe(ctx context.Context) (abi.Describe, bool) {
	in, _ := json.Marshal(abi.DescribeInput{ABI: abi.Version})
	out, ok := s.call(ctx, CheckDescribe, abi.ExportDescribe, in)
	if !ok {
		return abi.Describe{}, false
	}
	d, err := abi.DecodeDescribe(out, s.opts.Role)
	if err != nil {
		s.fail(CheckDescribe, abi.ClassPluginProtocol, "the reply breaks the ABI: %v", err)
		return abi.Describe{}, false
	}
	tools := make([]string, len(d.Tools))
	for i, t := range d.Tools {
		tools[i] = t.Name
	}
	detail := fmt.Sprintf("%s %s, %s %s", d.Name, d.Version, article(string(d.Role)), d.Role)
	if d.Role == abi.RoleExecutor {
		detail += fmt.Sprintf(" of %v effects", d.Effects)
		if len(tools) > 0 {
			detail += ", tools " + strings.Join(tools, ", ")
		}
	}
	s.report(CheckDescribe, Pass, "%s", detail)
	if d.Role == abi.RoleExecutor && !d.Attach {
		var unsafe []string
		for _, t := range d.Tools {
			if !t.Idempotent {
				unsafe = append(unsafe, t.Name)
			}
		}
		if len(unsafe) > 0 {
			s.report(CheckAttachDecl, Warn, "describe says attach: false and tools %s are not idempotent: after a crash their calls in flight cannot be re-attached, and fail under the missing-effect policy; keep records in the host KV and answer attach (then say attach: true)", strings.Join(unsafe, ", "))
		}
	}
	if s.opts.Tool != "" && !slices.ContainsFunc(d.Tools, func(t abi.Tool) bool { return t.Name == s.opts.Tool }) {
		s.fail(CheckDescribe, abi.ClassPluginProtocol, "--tool %s: describe offers no such tool (it offers %s)", s.opts.Tool, strings.Join(tools, ", "))
	}
	return d, true
}

// sampleView is the Run view a builder is checked with.
func sampleView() abi.BuildInput {
	return abi.BuildInput{
		ABI: abi.Version,
		Run: abi.RunView{ID: "verify_run", Tenant: "verify", Session: "verify", Step: 1, Input: "What is (2+3)*4?"},
		History: []abi.Message{
			{Role: abi.MessageUser, Content: "Hello"},
			{Role: abi.MessageAssistant, Content: "Hello! How can I help?"},
		},
		Transcript: []abi.Message{},
		Tools: []abi.Tool{{Name: "calculate", Description: "Evaluate an arithmetic expression",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`),
			Idempotent:  true, Approval: abi.ApprovalNever}},
	}
}

func (s *suite) build(ctx context.Context) {
	in, _ := json.Marshal(sampleView())
	out, ok := s.call(ctx, CheckBuild, abi.ExportBuild, in)
	if !ok {
		return
	}
	o, err := abi.DecodeBuildOutput(out)
	if err != nil {
		s.fail(CheckBuild, abi.ClassPluginProtocol, "for a sample Run view, the reply breaks the ABI: %v", err)
		return
	}
	s.report(CheckBuild, Pass, "a valid model request for a sample Run view (%d messages, %d tools)", len(o.Request.Messages), len(o.Request.Tools))
}

// effectInput makes the input of an executor call on a fresh effect.
func (s *suite) effectInput(kind abi.EffectKind, tool string, request json.RawMessage, handle string) abi.EffectInput {
	s.seq++
	id := fmt.Sprintf("verify_run.t%d.0", s.seq)
	if kind == abi.KindModel {
		id = fmt.Sprintf("verify_run.m%d", s.seq)
	}
	return abi.EffectInput{ABI: abi.Version, Handle: handle, Effect: abi.Effect{
		ID: id, AssignmentKey: "verify/verify/" + id + "#1", Attempt: 1,
		Kind: kind, Tool: tool, Request: request,
	}}
}

func (s *suite) executor(ctx context.Context, d abi.Describe) {
	if slices.Contains(d.Effects, abi.KindModel) {
		req, _ := json.Marshal(abi.ModelRequest{
			Messages: []abi.Message{
				{Role: abi.MessageSystem, Content: "You are a helpful assistant."},
				{Role: abi.MessageUser, Content: "What is (2+3)*4?"},
			},
			Tools: sampleView().Tools,
		})
		s.effect(ctx, s.effectInput(abi.KindModel, "", req, ""), "model step")
	}
	for _, t := range d.Tools {
		if s.opts.Tool != "" && t.Name != s.opts.Tool {
			continue
		}
		args := s.opts.Args
		if len(args) == 0 || s.opts.Tool == "" {
			args = SampleArguments(t.InputSchema)
		}
		req, _ := json.Marshal(abi.ToolRequest{Arguments: args})
		s.effect(ctx, s.effectInput(abi.KindTool, t.Name, req, ""), "tool "+t.Name+" "+string(args))
	}
	kind, tool := abi.KindModel, ""
	if len(d.Tools) > 0 {
		kind, tool = abi.KindTool, d.Tools[0].Name
	}
	s.unknownEffect(ctx, kind, tool)
}

// effect checks start's reply for one effect, its replay, and, for a
// pending one, poll and cancel with its handle.
func (s *suite) effect(ctx context.Context, in abi.EffectInput, what string) {
	raw, _ := json.Marshal(in)
	check := CheckStart + " (" + what + ")"
	out, ok := s.call(ctx, check, abi.ExportStart, raw)
	if !ok {
		return
	}
	r, err := abi.DecodeEffectReply(out, in.Effect.Kind, abi.ExportStart)
	if err != nil {
		s.fail(check, abi.ClassPluginProtocol, "the reply breaks the ABI: %v", err)
		return
	}
	s.report(check, Pass, "%s", replySummary(r))

	check = CheckReplay + " (" + what + ")"
	again, ok := s.call(ctx, check, abi.ExportStart, raw)
	if ok {
		r2, err := abi.DecodeEffectReply(again, in.Effect.Kind, abi.ExportStart)
		switch {
		case err != nil:
			s.fail(check, abi.ClassPluginProtocol, "the second start of %s attempt 1 breaks the ABI: %v", in.Effect.ID, err)
		case !sameReply(r, r2):
			s.fail(check, abi.ClassPluginProtocol, "starting %s attempt 1 again answered %s, the first time %s: treat (effect.id, attempt) as an idempotency key and answer the same",
				in.Effect.ID, replySummary(r2), replySummary(r))
		default:
			s.report(check, Pass, "the same (effect.id, attempt) gets the same reply")
		}
	}
	if r.State != abi.StatePending {
		return
	}
	in.Handle = r.Handle
	raw, _ = json.Marshal(in)
	check = "poll reply (" + what + ")"
	if out, ok := s.call(ctx, check, abi.ExportPoll, raw); ok {
		if pr, err := abi.DecodeEffectReply(out, in.Effect.Kind, abi.ExportPoll); err != nil {
			s.fail(check, abi.ClassPluginProtocol, "the reply breaks the ABI: %v", err)
		} else {
			s.report(check, Pass, "%s", replySummary(pr))
		}
	}
	check = "cancel reply (" + what + ")"
	if out, ok := s.call(ctx, check, abi.ExportCancel, raw); ok {
		if cr, err := abi.DecodeCancelReply(out, in.Effect.Kind); err != nil {
			s.fail(check, abi.ClassPluginProtocol, "the reply breaks the ABI: %v", err)
		} else {
			s.report(check, Pass, "%s", cr.State)
		}
	}
}

func (s *suite) unknownEffect(ctx context.Context, kind abi.EffectKind, tool string) {
	request := json.RawMessage(`{"arguments":{}}`)
	if kind == abi.KindModel {
		request = json.RawMessage(`{"messages":[{"role":"user","content":"hello"}]}`)
	}
	in := s.effectInput(kind, tool, request, "")
	in.Effect.ID = strings.Replace(in.Effect.ID, "verify_run", "verify_never_started", 1)
	in.Effect.AssignmentKey = "verify/verify/" + in.Effect.ID + "#1"
	raw, _ := json.Marshal(in)
	if out, ok := s.call(ctx, CheckAttach, abi.ExportAttach, raw); ok {
		r, err := abi.DecodeEffectReply(out, kind, abi.ExportAttach)
		switch {
		case err != nil:
			s.fail(CheckAttach, abi.ClassPluginProtocol, "the reply breaks the ABI: %v", err)
		case r.State != abi.StateUnknown:
			s.fail(CheckAttach, abi.ClassPluginProtocol, "answered %s for effect %s, which was never started: it must answer unknown, or recovery waits on, or settles, work that never happened", replySummary(r), in.Effect.ID)
		default:
			s.report(CheckAttach, Pass, "unknown")
		}
	}
	if out, ok := s.call(ctx, CheckCancel, abi.ExportCancel, raw); ok {
		r, err := abi.DecodeCancelReply(out, kind)
		switch {
		case err != nil:
			s.fail(CheckCancel, abi.ClassPluginProtocol, "the reply breaks the ABI: %v", err)
		case r.State == abi.StateDone:
			s.fail(CheckCancel, abi.ClassPluginProtocol, "answered done with an outcome for effect %s, which was never started: answer unknown", in.Effect.ID)
		default:
			s.report(CheckCancel, Pass, "%s, without trapping", r.State)
		}
	}
}

// malformedInput is cut short in the middle of the effect.
var malformedInput = []byte(`{"abi":1,"effect":{"id":"verify_run.t1.0","kind":`)

func (s *suite) malformed(ctx context.Context, role abi.Role) {
	exports := []string{abi.ExportBuild}
	if role == abi.RoleExecutor {
		exports = []string{abi.ExportStart, abi.ExportPoll, abi.ExportAttach, abi.ExportCancel}
	}
	for _, export := range exports {
		check := CheckMalformed + " (" + export + ")"
		out, elapsed, err := s.rawCall(ctx, export, malformedInput)
		if elapsed > s.slowest {
			s.slowest, s.slowOp = elapsed, export
		}
		var pe *runtime.PluginError
		if err != nil {
			if errors.As(err, &pe) && pe.Class == abi.ClassPluginProtocol {
				s.report(check, Pass, "refused with an error: %v", pe.Err)
			} else {
				s.fail(check, classOf(err), "%s: return non-zero with error_set, or reply failed", describeErr(export, err))
			}
			continue
		}
		var reply struct {
			State abi.State `json:"state"`
		}
		if !json.Valid(out) || json.Unmarshal(out, &reply) != nil {
			s.fail(check, abi.ClassPluginProtocol, "returned 0 with output that is not a JSON object (%s): return non-zero with error_set, or reply failed", clip(out))
			continue
		}
		acceptable := []abi.State{abi.StateFailed}
		if export != abi.ExportStart && export != abi.ExportBuild {
			acceptable = append(acceptable, abi.StateUnknown, abi.StateCancelled)
		}
		if !slices.Contains(acceptable, reply.State) {
			s.fail(check, abi.ClassPluginProtocol, "returned 0 with %s for input that is not valid JSON: return non-zero with error_set, or reply failed", clip(out))
			continue
		}
		s.report(check, Pass, "answered %s", reply.State)
	}
}

func (s *suite) timing() {
	limit := s.opts.Limits.CallTimeout
	switch {
	case limit <= 0:
		s.report(CheckCallTime, Pass, "slowest call %s (%s); no call timeout configured", s.slowest.Round(time.Millisecond), s.slowOp)
	case s.slowest > time.Duration(float64(limit)*s.opts.SlowFraction):
		s.report(CheckCallTime, Warn, "the slowest call, %s, took %s of the %s call timeout: it is close to the limit; do long work as pending and poll", s.slowOp, s.slowest.Round(time.Millisecond), limit)
	default:
		s.report(CheckCallTime, Pass, "slowest call %s (%s) of the %s call timeout", s.slowest.Round(time.Millisecond), s.slowOp, limit)
	}
}

func (s *suite) memory() {
	used := s.p.MemoryBytes()
	capBytes := int64(s.opts.Limits.MemoryPages) * 65536
	switch {
	case capBytes <= 0:
		s.report(CheckMemory, Pass, "%d KiB of linear memory in use", used>>10)
	case used > capBytes*8/10:
		s.report(CheckMemory, Warn, "%d KiB of linear memory in use, over 80%% of the %d KiB cap (memory_pages %d)", used>>10, capBytes>>10, s.opts.Limits.MemoryPages)
	default:
		s.report(CheckMemory, Pass, "%d KiB of linear memory in use, under the %d KiB cap (memory_pages %d)", used>>10, capBytes>>10, s.opts.Limits.MemoryPages)
	}
}

func replySummary(r abi.EffectReply) string {
	switch r.State {
	case abi.StateDone:
		return "done " + clip(r.Outcome)
	case abi.StateFailed:
		msg := ""
		if r.Error != nil {
			msg = r.Error.Message
		}
		return fmt.Sprintf("failed (%q)", msg)
	case abi.StatePending:
		return fmt.Sprintf("pending (handle %q, poll after %d ms)", r.Handle, r.PollAfterMS)
	}
	return string(r.State)
}

func sameReply(a, b abi.EffectReply) bool {
	if a.State != b.State || a.Handle != b.Handle {
		return false
	}
	if !sameJSON(a.Outcome, b.Outcome) {
		return false
	}
	ae, _ := json.Marshal(a.Error)
	be, _ := json.Marshal(b.Error)
	return bytes.Equal(ae, be)
}

func sameJSON(a, b json.RawMessage) bool {
	var va, vb any
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return bytes.Equal(ca, cb)
}

func clip(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// SampleArguments derives arguments for a tool from its input_schema: each
// property takes its default, its first example or enum value, or a
// sample of its type. Without a schema it is the empty object.
func SampleArguments(schema json.RawMessage) json.RawMessage {
	var sch struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if len(schema) == 0 || json.Unmarshal(schema, &sch) != nil || len(sch.Properties) == 0 {
		return json.RawMessage(`{}`)
	}
	names := make([]string, 0, len(sch.Properties))
	for n := range sch.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	args := map[string]any{}
	for _, n := range names {
		var p struct {
			Type     any   `json:"type"`
			Default  any   `json:"default"`
			Examples []any `json:"examples"`
			Enum     []any `json:"enum"`
		}
		_ = json.Unmarshal(sch.Properties[n], &p)
		switch {
		case p.Default != nil:
			args[n] = p.Default
		case len(p.Examples) > 0:
			args[n] = p.Examples[0]
		case len(p.Enum) > 0:
			args[n] = p.Enum[0]
		default:
			typ, _ := p.Type.(string)
			if ts, ok := p.Type.([]any); ok && len(ts) > 0 {
				typ, _ = ts[0].(string)
			}
			args[n] = map[string]any{
				"string": "2+3", "integer": 1, "number": 1, "boolean": false,
				"array": []any{}, "object": map[string]any{},
			}[typ]
		}
	}
	b, _ := json.Marshal(args)
	return b
}

func article(word string) string {
	if word != "" && strings.ContainsRune("aeiou", rune(word[0])) {
		return "an"
	}
	return "a"
}
