// Package runcodec is the stores' binary encoding of a Run's snapshot
// (loop.Run): a version byte, then every field in a fixed order, with
// length-prefixed strings and varint numbers. A store reloads and decodes
// the snapshot on every advance (docs/DESIGN.md §5.1), so its decoding is
// on the hot path of every Run; this form decodes without reflection and
// several times faster than the snapshot's JSON. The JSON form stays the
// one the API serves and the one to read when debugging (json.Marshal of
// the decoded Run). The package also holds MarshalJSON, the JSON the
// stores write their events and the runtime its model requests in.
//
// The encoding is exact: Decode(Append(nil, r)) is deeply equal to r, nil
// slices and empty ones apart, so a snapshot decides the same Actions
// whichever form it was stored in. A field added to loop.Run (or to a type
// it holds) must be added here too, in a new version if any store may hold
// the old one; TestEveryFieldRoundTrips fails until it is.
//
// Decode never panics on malformed input: it returns an error, and a count
// is checked against the bytes left before anything is allocated for it.
package runcodec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Version1 is the first byte of a snapshot in the first version of this
// encoding. A JSON snapshot starts with '{' (or white space), never with a
// version byte, so a reader tells the two forms apart (IsBinary). Stores
// also mark the records they frame around a snapshot with it
// (badgerstore's run header).
const Version1 byte = 0x01

// Version2 is the first byte of a snapshot in the second version: the
// first, plus each tool's pinned descriptor (loop.ToolSpec.Descriptor).
// A Run decoded from version 1 has no descriptors.
const Version2 byte = 0x02

// Version3 is the first byte of a snapshot in the current version: the
// second, plus the Run's agent (loop.Spec.Agent) after its tools. Append
// writes it; Decode reads every version, and a Run decoded from version 1
// or 2 has no agent (it runs as its tenant's default agent).
const Version3 byte = 0x03

// Version4 is the first byte of a snapshot in the fourth version: the
// third, followed by a tail of what came after it, in this order: each
// tool's agent (loop.ToolSpec.Agent), the Run's parent (Spec.Parent), its
// children (Run.Children), and each effect's tool-outcome usage
// (abi.ToolOutcome.Usage), the agent's output schema
// (AgentPin.OutputSchema, when the Run has an agent), the limits
// run_timeout_ms and wait_timeout_ms, and the Run's WaitingSince and
// WaitedMS. Fields added later go at the end of the tail,
// in a new version. A Run decoded from an older version has none of them.
const Version4 byte = 0x04

// Version5 is the first byte of a snapshot in the fifth version: the
// fourth, with its tail followed by what came after it, in this order:
// the rate-limit parameters of the model policy and then of each tool's
// policy (loop.Policy.MaxRateLimitedAttempts, MaxRetryAfterMS), each
// effect's count of rate-limited attempts (loop.Effect.RateLimited), and
// the RetryAfterMS of every failure the Run holds: each effect outcome's
// error, the verdict's failure and the Run's failure, in that order, each
// one that is present; then the Run's ChildrenUsage. A Run decoded from an
// older version has none of them (its policies take the Loop's defaults).
const Version5 byte = 0x05

// Version6 is the first byte of a snapshot in the sixth version: the
// fifth, with its tail followed by each effect's plugin version
// (loop.Effect.Plugin: present, then name, version and sha256). A Run
// decoded from an older version has none.
const Version6 byte = 0x06

// Version7 is the first byte of a snapshot in the current version: the
// sixth, followed by the Run's stored trace context
// (loop.Spec.TraceParent). A Run decoded from an older version has none.
const Version7 byte = 0x07

// Current is the version Append writes.
const Current = Version7

// IsBinary reports whether b is a snapshot (or a record) in this encoding,
// of any version, rather than JSON.
func IsBinary(b []byte) bool { return len(b) > 0 && b[0] >= Version1 && b[0] <= Current }

// Append appends r's encoding to dst, in the current version.
func Append(dst []byte, r *loop.Run) []byte {
	w := Writer{B: append(dst, Current)}
	// Spec.
	w.String(r.Tenant)
	w.String(r.Session)
	w.String(r.ID)
	w.String(r.Input)
	w.Raw(r.Metadata)
	w.Int(int64(r.Limits.MaxSteps))
	w.Int(int64(r.Limits.MaxToolCallsPerStep))
	w.Int(int64(r.Limits.MaxParallelToolCalls))
	w.Int(r.Limits.DeadlineMS)
	w.Int(r.Limits.EffectTimeoutMS)
	w.policy(r.ModelPolicy)
	w.Count(len(r.Tools), r.Tools == nil)
	for _, t := range r.Tools {
		w.String(t.Name)
		w.Bool(t.Approval)
		w.policy(t.Policy)
		w.Raw(t.InputSchema)
		w.Bool(t.Descriptor != nil)
		if d := t.Descriptor; d != nil {
			w.String(d.Name)
			w.String(d.Description)
			w.Raw(d.InputSchema)
			w.Bool(d.Idempotent)
			w.String(string(d.Approval))
		}
	}
	w.Bool(r.Agent != nil)
	if a := r.Agent; a != nil {
		w.String(a.Name)
		w.String(a.Version)
		w.String(a.Instructions)
		w.Raw(a.Settings)
	}
	// The Run's state.
	w.String(string(r.Status))
	w.Int(r.Seq)
	w.Int(r.CreatedAt)
	w.Int(r.UpdatedAt)
	w.Int(int64(r.Step))
	w.Count(len(r.Transcript), r.Transcript == nil)
	for i := range r.Transcript {
		w.message(&r.Transcript[i])
	}
	w.Count(len(r.Effects), r.Effects == nil)
	for i := range r.Effects {
		w.effect(&r.Effects[i])
	}
	w.usage(r.Usage)
	w.Bool(r.Awaiting != nil)
	if r.Awaiting != nil {
		w.String(r.Awaiting.Prompt)
	}
	w.Bool(r.Verdict != nil)
	if v := r.Verdict; v != nil {
		w.String(string(v.Status))
		w.String(v.Result)
		w.failure(v.Failure)
	}
	w.String(r.Result)
	w.failure(r.Failure)
	w.tail4(r)
	w.tail5(r)
	w.tail6(r)
	w.String(r.TraceParent)
	return w.B
}

// tail6 writes what version 6 added (see Version6).
func (w *Writer) tail6(r *loop.Run) {
	for _, e := range r.Effects {
		w.Bool(e.Plugin != nil)
		if p := e.Plugin; p != nil {
			w.String(p.Name)
			w.String(p.Version)
			w.String(p.SHA256)
		}
	}
}

// tail6 reads what Writer.tail6 wrote into r.
func (rd *Reader) tail6(r *loop.Run) {
	for i := range r.Effects {
		if rd.Bool() {
			r.Effects[i].Plugin = &loop.PluginRef{Name: rd.String(), Version: rd.String(), SHA256: rd.String()}
		}
	}
}

// tail5 writes what version 5 added (see Version5).
func (w *Writer) tail5(r *loop.Run) {
	w.rateLimits(r.ModelPolicy)
	for _, t := range r.Tools {
		w.rateLimits(t.Policy)
	}
	for _, e := range r.Effects {
		w.Int(int64(e.RateLimited))
	}
	for _, e := range r.Effects {
		if e.Outcome != nil && e.Outcome.Error != nil {
			w.Int(e.Outcome.Error.RetryAfterMS)
		}
	}
	if r.Verdict != nil && r.Verdict.Failure != nil {
		w.Int(r.Verdict.Failure.RetryAfterMS)
	}
	if r.Failure != nil {
		w.Int(r.Failure.RetryAfterMS)
	}
	w.usage(r.ChildrenUsage)
}

// tail5 reads what Writer.tail5 wrote into r.
func (rd *Reader) tail5(r *loop.Run) {
	rd.rateLimits(&r.ModelPolicy)
	for i := range r.Tools {
		rd.rateLimits(&r.Tools[i].Policy)
	}
	for i := range r.Effects {
		r.Effects[i].RateLimited = rd.int()
	}
	for i := range r.Effects {
		if o := r.Effects[i].Outcome; o != nil && o.Error != nil {
			o.Error.RetryAfterMS = rd.Int()
		}
	}
	if r.Verdict != nil && r.Verdict.Failure != nil {
		r.Verdict.Failure.RetryAfterMS = rd.Int()
	}
	if r.Failure != nil {
		r.Failure.RetryAfterMS = rd.Int()
	}
	r.ChildrenUsage = rd.usage()
}

func (w *Writer) rateLimits(p loop.Policy) {
	w.Int(int64(p.MaxRateLimitedAttempts))
	w.Int(p.MaxRetryAfterMS)
}

func (rd *Reader) rateLimits(p *loop.Policy) {
	p.MaxRateLimitedAttempts = rd.int()
	p.MaxRetryAfterMS = rd.Int()
}

// tail4 writes what version 4 added (see Version4).
func (w *Writer) tail4(r *loop.Run) {
	for _, t := range r.Tools {
		w.String(t.Agent)
	}
	w.Bool(r.Parent != nil)
	if p := r.Parent; p != nil {
		w.String(p.Run)
		w.String(p.Session)
		w.String(p.Effect)
		w.Int(int64(p.Attempt))
		w.String(p.ToolCallID)
		w.Int(int64(p.Depth))
	}
	w.Count(len(r.Children), r.Children == nil)
	for _, c := range r.Children {
		w.String(c.Run)
		w.String(c.Agent)
		w.String(c.Effect)
		w.Int(int64(c.Attempt))
		w.String(c.ToolCallID)
	}
	for _, e := range r.Effects {
		var u *abi.Usage
		if e.Outcome != nil && e.Outcome.Tool != nil {
			u = e.Outcome.Tool.Usage
		}
		w.Bool(u != nil)
		if u != nil {
			w.usage(*u)
		}
	}
	if r.Agent != nil {
		w.Raw(r.Agent.OutputSchema)
	}
	w.Int(r.Limits.RunTimeoutMS)
	w.Int(r.Limits.WaitTimeoutMS)
	w.Int(r.WaitingSince)
	w.Int(r.WaitedMS)
}

// tail4 reads what Writer.tail4 wrote into r.
func (rd *Reader) tail4(r *loop.Run) {
	for i := range r.Tools {
		r.Tools[i].Agent = rd.String()
	}
	if rd.Bool() {
		r.Parent = &loop.ParentRef{Run: rd.String(), Session: rd.String(), Effect: rd.String(),
			Attempt: rd.int(), ToolCallID: rd.String(), Depth: rd.int()}
	}
	if n, isNil := rd.Count(5); !isNil {
		r.Children = make([]loop.ChildRef, n)
		for i := range r.Children {
			r.Children[i] = loop.ChildRef{Run: rd.String(), Agent: rd.String(), Effect: rd.String(),
				Attempt: rd.int(), ToolCallID: rd.String()}
		}
	}
	for i := range r.Effects {
		if rd.Bool() {
			u := rd.usage()
			if o := r.Effects[i].Outcome; o != nil && o.Tool != nil {
				o.Tool.Usage = &u
			} else {
				rd.fail(errors.New("a tool-outcome usage on an effect without a tool outcome"))
			}
		}
	}
	if r.Agent != nil {
		r.Agent.OutputSchema = rd.Raw()
	}
	r.Limits.RunTimeoutMS = rd.Int()
	r.Limits.WaitTimeoutMS = rd.Int()
	r.WaitingSince = rd.Int()
	r.WaitedMS = rd.Int()
}

// Decode decodes a snapshot Append wrote, in any version. The strings it
// returns are copies; the raw JSON fields (metadata, arguments) share b's
// memory, so b must not be changed while the Run is in use.
func Decode(b []byte) (loop.Run, error) {
	if !IsBinary(b) {
		return loop.Run{}, errors.New("runcodec: not a binary snapshot (no version byte)")
	}
	version := b[0]
	rd := Reader{B: b[1:]}
	var r loop.Run
	r.Tenant = rd.String()
	r.Session = rd.String()
	r.ID = rd.String()
	r.Input = rd.String()
	r.Metadata = rd.Raw()
	r.Limits.MaxSteps = rd.int()
	r.Limits.MaxToolCallsPerStep = rd.int()
	r.Limits.MaxParallelToolCalls = rd.int()
	r.Limits.DeadlineMS = rd.Int()
	r.Limits.EffectTimeoutMS = rd.Int()
	r.ModelPolicy = rd.policy()
	if n, isNil := rd.Count(4); !isNil {
		r.Tools = make([]loop.ToolSpec, n)
		for i := range r.Tools {
			r.Tools[i] = loop.ToolSpec{Name: rd.String(), Approval: rd.Bool(), Policy: rd.policy(), InputSchema: rd.Raw()}
			if version >= Version2 && rd.Bool() {
				r.Tools[i].Descriptor = &abi.Tool{Name: rd.String(), Description: rd.String(), InputSchema: rd.Raw(),
					Idempotent: rd.Bool(), Approval: abi.Approval(rd.String())}
			}
		}
	}
	if version >= Version3 && rd.Bool() {
		r.Agent = &loop.AgentPin{Name: rd.String(), Version: rd.String(), Instructions: rd.String(), Settings: rd.Raw()}
	}
	r.Status = loop.Status(rd.String())
	r.Seq = rd.Int()
	r.CreatedAt = rd.Int()
	r.UpdatedAt = rd.Int()
	r.Step = rd.int()
	if n, isNil := rd.Count(5); !isNil {
		r.Transcript = make([]abi.Message, n)
		for i := range r.Transcript {
			rd.message(&r.Transcript[i])
		}
	}
	if n, isNil := rd.Count(17); !isNil {
		r.Effects = make([]loop.Effect, n)
		for i := range r.Effects {
			rd.effect(&r.Effects[i])
		}
	}
	r.Usage = rd.usage()
	if rd.Bool() {
		r.Awaiting = &abi.AwaitInput{Prompt: rd.String()}
	}
	if rd.Bool() {
		r.Verdict = &loop.Verdict{Status: loop.Status(rd.String()), Result: rd.String(), Failure: rd.failure()}
	}
	r.Result = rd.String()
	r.Failure = rd.failure()
	if version >= Version4 {
		rd.tail4(&r)
	}
	if version >= Version5 {
		rd.tail5(&r)
	}
	if version >= Version6 {
		rd.tail6(&r)
	}
	if version >= Version7 {
		r.TraceParent = rd.String()
	}
	if rd.Err != nil {
		return loop.Run{}, fmt.Errorf("runcodec: snapshot: %w", rd.Err)
	}
	if len(rd.B) != 0 {
		return loop.Run{}, fmt.Errorf("runcodec: snapshot: %d bytes after its end", len(rd.B))
	}
	return r, nil
}

func (w *Writer) policy(p loop.Policy) {
	w.String(string(p.Mode))
	w.Int(int64(p.MaxAttempts))
	w.Int(p.BackoffMS)
	w.Int(p.MaxBackoffMS)
}

func (rd *Reader) policy() loop.Policy {
	return loop.Policy{Mode: loop.PolicyMode(rd.String()), MaxAttempts: rd.int(), BackoffMS: rd.Int(), MaxBackoffMS: rd.Int()}
}

func (w *Writer) usage(u abi.Usage) {
	w.Int(u.InputTokens)
	w.Int(u.OutputTokens)
}

func (rd *Reader) usage() abi.Usage { return abi.Usage{InputTokens: rd.Int(), OutputTokens: rd.Int()} }

func (w *Writer) failure(f *loop.Failure) {
	w.Bool(f != nil)
	if f != nil {
		w.String(string(f.Class))
		w.String(f.Message)
		w.Bool(f.Retriable)
	}
}

func (rd *Reader) failure() *loop.Failure {
	if !rd.Bool() {
		return nil
	}
	return &loop.Failure{Class: abi.ErrorClass(rd.String()), Message: rd.String(), Retriable: rd.Bool()}
}

func (w *Writer) message(m *abi.Message) {
	w.String(m.Role)
	w.String(m.Content)
	w.Count(len(m.ToolCalls), m.ToolCalls == nil)
	for _, c := range m.ToolCalls {
		w.String(c.ID)
		w.String(c.Name)
		w.Raw(c.Arguments)
	}
	w.String(m.ToolCallID)
	w.Bool(m.IsError)
}

func (rd *Reader) message(m *abi.Message) {
	m.Role = rd.String()
	m.Content = rd.String()
	if n, isNil := rd.Count(3); !isNil {
		m.ToolCalls = make([]abi.ToolCall, n)
		for i := range m.ToolCalls {
			m.ToolCalls[i] = abi.ToolCall{ID: rd.String(), Name: rd.String(), Arguments: rd.Raw()}
		}
	}
	m.ToolCallID = rd.String()
	m.IsError = rd.Bool()
}

func (w *Writer) effect(e *loop.Effect) {
	w.String(e.ID)
	w.String(string(e.Kind))
	w.Int(int64(e.Step))
	w.Int(int64(e.Index))
	w.String(e.ToolCallID)
	w.String(e.Tool)
	w.Raw(e.Arguments)
	w.Int(e.RequestSeq)
	w.String(string(e.State))
	w.Int(int64(e.Attempt))
	w.Uint(e.Epoch)
	w.String(e.Handle)
	w.Int(e.DispatchedAt)
	w.Int(e.NotBefore)
	w.Bool(e.Outcome != nil)
	if o := e.Outcome; o != nil {
		w.String(string(o.State))
		w.Bool(o.Model != nil)
		if m := o.Model; m != nil {
			w.message(&m.Message)
			w.usage(m.Usage)
			w.Bool(m.AwaitInput != nil)
			if m.AwaitInput != nil {
				w.String(m.AwaitInput.Prompt)
			}
		}
		w.Bool(o.Tool != nil)
		if t := o.Tool; t != nil {
			w.String(t.Content)
			w.Bool(t.IsError)
		}
		w.failure(o.Error)
	}
	w.Int(int64(e.Failures))
	w.Int(e.DeferredSince)
}

func (rd *Reader) effect(e *loop.Effect) {
	e.ID = rd.String()
	e.Kind = abi.EffectKind(rd.String())
	e.Step = rd.int()
	e.Index = rd.int()
	e.ToolCallID = rd.String()
	e.Tool = rd.String()
	e.Arguments = rd.Raw()
	e.RequestSeq = rd.Int()
	e.State = loop.EffectState(rd.String())
	e.Attempt = rd.int()
	e.Epoch = rd.Uint()
	e.Handle = rd.String()
	e.DispatchedAt = rd.Int()
	e.NotBefore = rd.Int()
	if rd.Bool() {
		o := &loop.Outcome{State: loop.OutcomeState(rd.String())}
		if rd.Bool() {
			m := &abi.ModelOutcome{}
			rd.message(&m.Message)
			m.Usage = rd.usage()
			if rd.Bool() {
				m.AwaitInput = &abi.AwaitInput{Prompt: rd.String()}
			}
			o.Model = m
		}
		if rd.Bool() {
			o.Tool = &abi.ToolOutcome{Content: rd.String(), IsError: rd.Bool()}
		}
		o.Error = rd.failure()
		e.Outcome = o
	}
	e.Failures = rd.int()
	e.DeferredSince = rd.Int()
}

// Writer appends the encoding's primitives to B. Stores use it for the
// records they frame around a snapshot (badgerstore's run header).
type Writer struct{ B []byte }

// String appends a length-prefixed string.
func (w *Writer) String(s string) {
	w.B = binary.AppendUvarint(w.B, uint64(len(s)))
	w.B = append(w.B, s...)
}

// Raw appends raw JSON bytes, keeping nil apart from empty.
func (w *Writer) Raw(b json.RawMessage) {
	w.Count(len(b), b == nil)
	w.B = append(w.B, b...)
}

// Count appends a slice's length, keeping a nil slice apart from an
// empty one.
func (w *Writer) Count(n int, isNil bool) {
	if isNil {
		w.B = append(w.B, 0)
		return
	}
	w.B = binary.AppendUvarint(w.B, uint64(n)+1)
}

// Int appends a signed varint.
func (w *Writer) Int(v int64) { w.B = binary.AppendVarint(w.B, v) }

// Uint appends an unsigned varint.
func (w *Writer) Uint(v uint64) { w.B = binary.AppendUvarint(w.B, v) }

// Bool appends one byte, 0 or 1.
func (w *Writer) Bool(v bool) {
	if v {
		w.B = append(w.B, 1)
	} else {
		w.B = append(w.B, 0)
	}
}

// Reader reads what Writer wrote from B. The first malformed read sets
// Err; every read after it returns a zero value.
type Reader struct {
	B   []byte
	Err error
}

var errTruncated = errors.New("truncated")

func (rd *Reader) fail(err error) {
	if rd.Err == nil {
		rd.Err = err
	}
	rd.B = nil
}

// Uint reads an unsigned varint.
func (rd *Reader) Uint() uint64 {
	if rd.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(rd.B)
	if n <= 0 {
		rd.fail(errTruncated)
		return 0
	}
	rd.B = rd.B[n:]
	return v
}

// Int reads a signed varint.
func (rd *Reader) Int() int64 {
	if rd.Err != nil {
		return 0
	}
	v, n := binary.Varint(rd.B)
	if n <= 0 {
		rd.fail(errTruncated)
		return 0
	}
	rd.B = rd.B[n:]
	return v
}

// int reads a signed varint into an int.
func (rd *Reader) int() int { return int(rd.Int()) }

// Bool reads one byte, which must be 0 or 1.
func (rd *Reader) Bool() bool {
	if rd.Err != nil {
		return false
	}
	if len(rd.B) == 0 {
		rd.fail(errTruncated)
		return false
	}
	v := rd.B[0]
	rd.B = rd.B[1:]
	if v > 1 {
		rd.fail(fmt.Errorf("a boolean byte is %d", v))
		return false
	}
	return v == 1
}

// bytes reads n bytes, sharing B's memory.
func (rd *Reader) bytes(n uint64) []byte {
	if rd.Err != nil {
		return nil
	}
	if n > uint64(len(rd.B)) {
		rd.fail(errTruncated)
		return nil
	}
	b := rd.B[:n:n]
	rd.B = rd.B[n:]
	return b
}

// String reads a length-prefixed string (a copy).
func (rd *Reader) String() string { return string(rd.bytes(rd.Uint())) }

// Raw reads raw JSON bytes (sharing B's memory); nil stays nil.
func (rd *Reader) Raw() json.RawMessage {
	n, isNil := rd.Count(1)
	if isNil {
		return nil
	}
	return json.RawMessage(rd.bytes(uint64(n)))
}

// Count reads a length Writer.Count wrote; isNil reports a nil slice.
// Each element takes at least minBytes, so a length the bytes left cannot
// hold is refused before the caller allocates for it.
func (rd *Reader) Count(minBytes int) (n int, isNil bool) {
	v := rd.Uint()
	if rd.Err != nil {
		return 0, true
	}
	if v == 0 {
		return 0, true
	}
	v--
	if minBytes < 1 {
		minBytes = 1
	}
	if v > uint64(len(rd.B))/uint64(minBytes) {
		rd.fail(fmt.Errorf("a length of %d is more than the %d bytes left can hold", v, len(rd.B)))
		return 0, true
	}
	return int(v), false
}

// Unmarshal decodes a stored snapshot in either form: this encoding, or
// the JSON that stores wrote before it (and that a store copied from an
// older one may still hold). A store reads every snapshot through it, so
// a directory or database written before the binary form stays readable;
// its next commit rewrites the snapshot in the binary form.
func Unmarshal(b []byte) (loop.Run, error) {
	if IsBinary(b) {
		return Decode(b)
	}
	var r loop.Run
	if err := json.Unmarshal(b, &r); err != nil {
		return loop.Run{}, fmt.Errorf("runcodec: JSON snapshot: %w", err)
	}
	return r, nil
}
