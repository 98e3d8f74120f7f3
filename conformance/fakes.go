package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/agenthost/agenthost/conformance/script"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// EchoBuilder is a runtime.Builder that passes the history and the
// transcript through as the request's messages, with every tool. For
// tests; not a stable API.
type EchoBuilder struct {
	mu    sync.Mutex
	calls int
}

var _ runtime.Builder = (*EchoBuilder)(nil)

// Build implements runtime.Builder.
func (b *EchoBuilder) Build(_ context.Context, _ string, in abi.BuildInput) (abi.BuildOutput, error) {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	msgs := append(append([]abi.Message{}, in.History...), in.Transcript...)
	return abi.BuildOutput{Request: abi.ModelRequest{Messages: msgs, Tools: in.Tools}}, nil
}

// Calls returns how many times Build ran.
func (b *EchoBuilder) Calls() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls
}

// ScriptedModel is a model runtime.Executor that follows the script in the
// Run's input (see package conformance/script). It answers start at once.
// For tests; not a stable API.
type ScriptedModel struct {
	counter
}

var _ runtime.Executor = (*ScriptedModel)(nil)

// Start implements runtime.Executor.
func (m *ScriptedModel) Start(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	m.count(abi.ExportStart, c)
	var req abi.ModelRequest
	if err := json.Unmarshal(c.Input.Effect.Request, &req); err != nil {
		return abi.EffectReply{}, &runtime.PluginError{Class: abi.ClassPluginProtocol, Plugin: "scripted-model", Export: abi.ExportStart, Err: err}
	}
	out, err := script.Reply(req)
	if err != nil {
		return abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: err.Error()}}, nil
	}
	raw, _ := json.Marshal(out)
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}, nil
}

// Poll implements runtime.Executor; the scripted model keeps nothing.
func (m *ScriptedModel) Poll(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	m.count(abi.ExportPoll, c)
	return abi.EffectReply{State: abi.StateUnknown}, nil
}

// Attach implements runtime.Executor; the scripted model keeps nothing.
func (m *ScriptedModel) Attach(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	m.count(abi.ExportAttach, c)
	return abi.EffectReply{State: abi.StateUnknown}, nil
}

// Cancel implements runtime.Executor.
func (m *ScriptedModel) Cancel(_ context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	m.count(abi.ExportCancel, c)
	return abi.CancelReply{State: abi.StateUnknown}, nil
}

// counter records executor calls by export and by (effect, attempt).
type counter struct {
	mu       sync.Mutex
	byExport map[string]int
	byKey    map[string]int // export + " " + assignment key
}

func (c *counter) count(export string, call runtime.EffectCall) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byExport == nil {
		c.byExport, c.byKey = map[string]int{}, map[string]int{}
	}
	c.byExport[export]++
	c.byKey[export+" "+call.Input.Effect.AssignmentKey]++
}

// Calls returns how many times export was called.
func (c *counter) Calls(export string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byExport[export]
}

// Keys returns "export key=count" for every call recorded, for failure
// messages.
func (c *counter) Keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, n := range c.byKey {
		out = append(out, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(out)
	return out
}

// CallsFor returns how many times export was called for one assignment key.
func (c *counter) CallsFor(export, assignmentKey string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byKey[export+" "+assignmentKey]
}

// ScriptedTools is a tool runtime.Executor whose behaviour is chosen by the
// tool's name. For tests; not a stable API.
//
//	echo   done at once; the content is the "text" argument (or all arguments)
//	wire   like echo (tests gate it behind an approval)
//	slow   pending; done after SlowPolls polls; attach answers from its
//	       record (pending or done) or unknown without one
//	fail   failed, not retriable
//	flaky  failed as retriable on attempt 1, done after that
//	block  start blocks until Release (or the call's context ends)
//	lost   pending, then unknown on every poll and attach
type ScriptedTools struct {
	counter
	// SlowPolls is the number of polls after which a slow job is done
	// (default 1).
	SlowPolls int
	// ForgetOnAttach makes attach answer unknown for every job, like an
	// executor that keeps nothing across a restart.
	ForgetOnAttach bool
	// DoneAtAttach makes attach find every slow job done, as a restart
	// that comes after the job's end does.
	DoneAtAttach bool

	mu      sync.Mutex
	jobs    map[string]*slowJob // by effect id + attempt
	release chan struct{}
	once    sync.Once
}

type slowJob struct {
	polls     int
	content   string
	cancelled bool
}

var _ runtime.Executor = (*ScriptedTools)(nil)

// Tools returns descriptors for every tool the executor offers.
func (s *ScriptedTools) Tools() []abi.Tool {
	var out []abi.Tool
	for _, n := range []string{"echo", "wire", "slow", "fail", "flaky", "block", "lost"} {
		out = append(out, abi.Tool{Name: n, Description: "scripted test tool " + n, Approval: abi.ApprovalNever,
			InputSchema: json.RawMessage(`{"type":"object"}`)})
	}
	return out
}

// Release unblocks every current and future "block" call.
func (s *ScriptedTools) Release() { s.once.Do(func() { close(s.releaseCh()) }) }

func (s *ScriptedTools) releaseCh() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release == nil {
		s.release = make(chan struct{})
	}
	return s.release
}

func jobKey(c runtime.EffectCall) string {
	return fmt.Sprintf("%s#%d", c.Input.Effect.ID, c.Input.Effect.Attempt)
}

func toolContent(c runtime.EffectCall) string {
	var req struct {
		Arguments map[string]any `json:"arguments"`
	}
	_ = json.Unmarshal(c.Input.Effect.Request, &req)
	if t, ok := req.Arguments["text"].(string); ok {
		return t
	}
	raw, _ := json.Marshal(req.Arguments)
	return string(raw)
}

func done(content string) abi.EffectReply {
	raw, _ := json.Marshal(abi.ToolOutcome{Content: content})
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}
}

// Start implements runtime.Executor.
func (s *ScriptedTools) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	s.count(abi.ExportStart, c)
	switch strings.TrimSpace(c.Input.Effect.Tool) {
	case "echo", "wire":
		return done(toolContent(c)), nil
	case "slow", "lost":
		s.mu.Lock()
		if s.jobs == nil {
			s.jobs = map[string]*slowJob{}
		}
		if _, ok := s.jobs[jobKey(c)]; !ok {
			s.jobs[jobKey(c)] = &slowJob{content: "slow:" + toolContent(c)}
		}
		s.mu.Unlock()
		return abi.EffectReply{State: abi.StatePending, Handle: "job-" + jobKey(c)}, nil
	case "fail":
		return abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: "tool failed on purpose"}}, nil
	case "flaky":
		if c.Input.Effect.Attempt == 1 {
			return abi.EffectReply{State: abi.StateFailed, Error: &abi.ReplyError{Message: "flaky: first attempt fails", Retriable: true}}, nil
		}
		return done("flaky ok on attempt " + fmt.Sprint(c.Input.Effect.Attempt)), nil
	case "block":
		select {
		case <-s.releaseCh():
			return done("unblocked"), nil
		case <-ctx.Done():
			return abi.EffectReply{}, ctx.Err()
		}
	}
	return abi.EffectReply{}, &runtime.PluginError{Class: abi.ClassPluginDenied, Plugin: "scripted-tools", Export: abi.ExportStart,
		Err: fmt.Errorf("unknown tool %q", c.Input.Effect.Tool)}
}

// Poll implements runtime.Executor.
func (s *ScriptedTools) Poll(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	s.count(abi.ExportPoll, c)
	return s.jobState(c, true), nil
}

// Attach implements runtime.Executor.
func (s *ScriptedTools) Attach(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	s.count(abi.ExportAttach, c)
	if s.ForgetOnAttach {
		return abi.EffectReply{State: abi.StateUnknown}, nil
	}
	return s.jobState(c, false), nil
}

func (s *ScriptedTools) jobState(c runtime.EffectCall, poll bool) abi.EffectReply {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[jobKey(c)]
	if j == nil || c.Input.Effect.Tool == "lost" || j.cancelled {
		return abi.EffectReply{State: abi.StateUnknown}
	}
	if poll {
		j.polls++
	}
	if j.polls >= max(s.SlowPolls, 1) || !poll && s.DoneAtAttach {
		return done(j.content)
	}
	return abi.EffectReply{State: abi.StatePending, Handle: "job-" + jobKey(c)}
}

// Cancel implements runtime.Executor: a slow job is cancelled; a finished
// one answers done with its outcome; anything else is unknown.
func (s *ScriptedTools) Cancel(_ context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	s.count(abi.ExportCancel, c)
	s.mu.Lock()
	defer s.mu.Unlock()
	if j := s.jobs[jobKey(c)]; j != nil {
		if j.polls >= max(s.SlowPolls, 1) {
			r := done(j.content)
			return abi.CancelReply{State: abi.StateDone, Outcome: r.Outcome}, nil
		}
		j.cancelled = true
		return abi.CancelReply{State: abi.StateCancelled}, nil
	}
	return abi.CancelReply{State: abi.StateUnknown}, nil
}

// ErrFake is returned by fakes told to fail.
var ErrFake = errors.New("conformance: fake failure")

// CountingExecutor wraps an executor and counts its calls by export and by
// assignment key, at the port boundary, whatever the executor is. For
// tests; not a stable API.
type CountingExecutor struct {
	counter
	Next runtime.Executor
}

var _ runtime.Executor = (*CountingExecutor)(nil)

// Start implements runtime.Executor.
func (c *CountingExecutor) Start(ctx context.Context, call runtime.EffectCall) (abi.EffectReply, error) {
	c.count(abi.ExportStart, call)
	return c.Next.Start(ctx, call)
}

// Poll implements runtime.Executor.
func (c *CountingExecutor) Poll(ctx context.Context, call runtime.EffectCall) (abi.EffectReply, error) {
	c.count(abi.ExportPoll, call)
	return c.Next.Poll(ctx, call)
}

// Attach implements runtime.Executor.
func (c *CountingExecutor) Attach(ctx context.Context, call runtime.EffectCall) (abi.EffectReply, error) {
	c.count(abi.ExportAttach, call)
	return c.Next.Attach(ctx, call)
}

// Cancel implements runtime.Executor.
func (c *CountingExecutor) Cancel(ctx context.Context, call runtime.EffectCall) (abi.CancelReply, error) {
	c.count(abi.ExportCancel, call)
	return c.Next.Cancel(ctx, call)
}

// GateExecutor passes calls through to Next while open; while Closed is
// set it answers every call with runtime.ErrExecutorUnavailable, like a
// plugin that is missing or fails to load. For tests; not a stable API.
type GateExecutor struct {
	Next   runtime.Executor
	Closed atomic.Bool
}

var _ runtime.Executor = (*GateExecutor)(nil)

func (g *GateExecutor) shut() error {
	if g.Closed.Load() {
		return fmt.Errorf("conformance: gate closed: %w", runtime.ErrExecutorUnavailable)
	}
	return nil
}

// Start implements runtime.Executor.
func (g *GateExecutor) Start(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	if err := g.shut(); err != nil {
		return abi.EffectReply{}, err
	}
	return g.Next.Start(ctx, c)
}

// Poll implements runtime.Executor.
func (g *GateExecutor) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	if err := g.shut(); err != nil {
		return abi.EffectReply{}, err
	}
	return g.Next.Poll(ctx, c)
}

// Attach implements runtime.Executor.
func (g *GateExecutor) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	if err := g.shut(); err != nil {
		return abi.EffectReply{}, err
	}
	return g.Next.Attach(ctx, c)
}

// Cancel implements runtime.Executor.
func (g *GateExecutor) Cancel(ctx context.Context, c runtime.EffectCall) (abi.CancelReply, error) {
	if err := g.shut(); err != nil {
		return abi.CancelReply{}, err
	}
	return g.Next.Cancel(ctx, c)
}
