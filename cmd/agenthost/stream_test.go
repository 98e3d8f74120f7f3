package main

import (
	"strings"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The printer writes a model's answer as it streams in, on a line of
// its own per attempt, and ends that line before anything else.
func TestThePrinterStreamsAnAnswerAsItComes(t *testing.T) {
	var out strings.Builder
	p := newPrinter(&out)
	effect := loop.ModelEffectID("run_1", 1)
	delta := func(attempt int, text string) runtime.StreamItem {
		return runtime.StreamItem{Emit: &abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{Text: text}}, EffectID: effect, Attempt: attempt}
	}
	p.item(delta(1, "Par"))
	if got := out.String(); got != "  model › Par" {
		t.Fatalf("after one delta: %q; want it printed at once, without a line end", got)
	}
	p.item(delta(1, "is is\nlovely"))
	p.item(delta(2, "Paris"))
	p.item(runtime.StreamItem{Emit: &abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{{Index: 0, Name: "x"}}}}, EffectID: effect, Attempt: 2})
	p.item(delta(2, " it is."))
	p.item(runtime.StreamItem{Event: &loop.Event{Type: loop.EventRunCompleted, Result: "Paris it is."}})
	want := "  model › Paris is\n    lovely\n" +
		"  model (attempt 2) › Paris it is.\n" +
		"answer: Paris it is.\nrun completed\n"
	if got := out.String(); got != want {
		t.Fatalf("printed:\n%s\nwant:\n%s", got, want)
	}
}
