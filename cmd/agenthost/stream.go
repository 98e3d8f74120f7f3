package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// printer renders a Run's stream for a person, one line per fact.
type printer struct {
	w io.Writer

	mu    sync.Mutex
	runID string
	calls map[string]abi.ToolCall // by effect ID and by tool call ID
	// streaming names the model call (effect and attempt) whose answer
	// is being printed as it streams in, on a line not yet ended.
	streaming string
}

func newPrinter(w io.Writer) *printer { return &printer{w: w, calls: map[string]abi.ToolCall{}} }

// printf prints one line, after ending a streaming answer's line.
func (p *printer) printf(format string, args ...any) {
	p.endStream()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// endStream ends the line of the answer being streamed, if any.
func (p *printer) endStream() {
	if p.streaming != "" {
		fmt.Fprintln(p.w)
		p.streaming = ""
	}
}

func (p *printer) item(it runtime.StreamItem) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case it.Emit != nil && it.Emit.Type == abi.EmitModelDelta:
		p.delta(it)
		return
	case it.Emit != nil:
		p.printf("    · %s: %s", it.Plugin, oneLineText(it.Emit.Message))
		return
	}
	if it.Event != nil {
		p.event(*it.Event)
	}
}

// delta prints a model's answer as it streams in, on a line of its own
// for each attempt; the committed reply is printed again when it settles
// (or as the Run's answer), since that is the one that counts.
func (p *printer) delta(it runtime.StreamItem) {
	if it.Emit.Delta == nil || it.Emit.Delta.Text == "" {
		return // tool calls print when they settle
	}
	key := fmt.Sprintf("%s#%d", it.EffectID, it.Attempt)
	if key != p.streaming {
		p.endStream()
		if it.Attempt > 1 {
			fmt.Fprintf(p.w, "  %s (attempt %d) › ", p.effectName(it.EffectID), it.Attempt)
		} else {
			fmt.Fprintf(p.w, "  %s › ", p.effectName(it.EffectID))
		}
		p.streaming = key
	}
	io.WriteString(p.w, strings.ReplaceAll(it.Emit.Delta.Text, "\n", "\n    "))
}

func (p *printer) event(ev loop.Event) {
	switch ev.Type {
	case loop.EventRunCreated:
		p.runID = ev.Spec.ID
		p.printf("run %s (tenant %s, session %s)", ev.Spec.ID, ev.Spec.Tenant, ev.Spec.Session)
		if a := ev.Spec.Agent; a != nil {
			p.printf("agent: %s %s", a.Name, a.Version)
		}
		p.printf("  question: %s", oneLineText(ev.Spec.Input))
	case loop.EventModelStepPlanned:
		var req abi.ModelRequest
		_ = json.Unmarshal(ev.Request, &req)
		p.printf("step %d: the builder planned a model request (%d messages, %d tools)", ev.Step, len(req.Messages), len(req.Tools))
	case loop.EventEffectDispatched:
		if ev.Attempt > 1 {
			p.printf("  %s: attempt %d", p.effectName(ev.EffectID), ev.Attempt)
		}
	case loop.EventEffectPending:
		p.printf("  %s: pending (the executor works on it; handle %q)", p.effectName(ev.EffectID), ev.Handle)
	case loop.EventEffectDeferred:
		p.printf("  %s: its executor is unavailable; recovery asks it again until max_defer passes", p.effectName(ev.EffectID))
	case loop.EventEffectSettled:
		p.settled(ev)
	case loop.EventApprovalRecorded:
		for _, a := range ev.Approvals {
			verdict := "approved"
			if !a.Approved {
				verdict = "denied"
			}
			p.printf("  %s: %s %s", p.callName(a.ToolCallID), verdict, a.Reason)
		}
	case loop.EventInputProvided:
		p.printf("  input: %s", oneLineText(ev.Input))
	case loop.EventCancelRequested:
		p.printf("  cancel requested: %s", ev.Reason)
	case loop.EventStepFailed:
		p.printf("  the builder failed: %s", failureText(ev.Failure))
	case loop.EventRunCompleted:
		p.printf("answer: %s", ev.Result)
		p.printf("run completed")
	case loop.EventRunFailed:
		p.printf("run failed: %s", failureText(ev.Failure))
	case loop.EventRunCancelled:
		p.printf("run cancelled: %s", failureText(ev.Failure))
	}
}

func (p *printer) settled(ev loop.Event) {
	o := ev.Outcome
	ref, err := loop.ParseEffectID(ev.EffectID)
	isModel := err == nil && ref.Kind == string(abi.KindModel)
	name := p.effectName(ev.EffectID)
	switch {
	case o == nil:
		return
	case o.State == loop.OutcomeFailed:
		p.printf("  %s failed: %s", name, failureText(o.Error))
	case o.State == loop.OutcomeCancelled:
		p.printf("  %s cancelled", name)
	case isModel && o.Model != nil:
		m := o.Model.Message
		if len(m.ToolCalls) == 0 && o.Model.AwaitInput == nil {
			return // the final answer: run_completed prints it
		}
		if strings.TrimSpace(m.Content) != "" {
			p.printf("  model: %s", oneLineText(m.Content))
		}
		for i, c := range m.ToolCalls {
			p.calls[loop.ToolEffectID(ref.Run, ref.Step, i)] = c
			p.calls[c.ID] = c
			p.printf("  model calls %s %s", c.Name, argsText(c.Arguments))
		}
		if o.Model.AwaitInput != nil {
			p.printf("  model asks: %s", oneLineText(o.Model.AwaitInput.Prompt))
		}
	case o.Tool != nil:
		verb := "returned"
		if o.Tool.IsError {
			verb = "returned an error"
		}
		p.printf("  %s %s: %s", name, verb, oneLineText(o.Tool.Content))
	}
}

// waiting says what a Run waits for.
func (p *printer) waiting(w *runtime.Waiting, session string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range w.Approvals {
		p.printf("waiting: %s needs a person's approval (tool call %s)", p.callName(id), id)
	}
	if w.Input != nil {
		p.printf("waiting: the model asks the user: %s", oneLineText(w.Input.Prompt))
	}
	if w.Queued {
		p.printf("waiting: an earlier Run of session %s is not finished; this one starts after it", session)
	}
}

func (p *printer) effectName(effectID string) string {
	if c, ok := p.calls[effectID]; ok {
		return "tool " + c.Name
	}
	if ref, err := loop.ParseEffectID(effectID); err == nil && ref.Kind == string(abi.KindModel) {
		return "model"
	}
	return effectID
}

func (p *printer) callName(toolCallID string) string {
	if c, ok := p.calls[toolCallID]; ok {
		return fmt.Sprintf("tool %s %s", c.Name, argsText(c.Arguments))
	}
	return "tool call " + toolCallID
}

func argsText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func failureText(f *loop.Failure) string {
	if f == nil {
		return "no reason recorded"
	}
	return oneLineText(f.Error())
}

func oneLineText(s string) string {
	s = strings.TrimSpace(s)
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return strings.ReplaceAll(s, "\n", " ⏎ ")
}
