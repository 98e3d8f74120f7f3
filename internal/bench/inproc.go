package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/internal/metrics"
	"github.com/agenthost/agenthost/internal/plugincatalog"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The in-process plugins of `bench runs --in-process`: Go twins of the
// three Wasm plugins the bench loads, answering the bench's question the
// same way (2 model steps, 2 calculate calls, the same answer) at once
// and without Wasm, so that what is measured is the runtime and the store
// alone. The binary links no package conformance (it links testing), so
// they live here.

// inProcessBuilder is prompt-builder's twin: the Run's own transcript and
// the tools.
type inProcessBuilder struct{}

func (inProcessBuilder) Build(_ context.Context, _ string, in abi.BuildInput) (abi.BuildOutput, error) {
	return abi.BuildOutput{Request: abi.ModelRequest{Messages: in.Transcript, Tools: in.Tools}}, nil
}

// inProcessModel is scripted-model's twin for the bench question: first it
// asks calculate for both sums at once, then, with their results, it
// answers.
type inProcessModel struct{}

// benchSums are the calculations of benchQuestion.
var benchSums = []string{"2+3", "4+5"}

func (inProcessModel) Start(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	var req abi.ModelRequest
	if err := json.Unmarshal(c.Input.Effect.Request, &req); err != nil {
		return abi.EffectReply{}, fmt.Errorf("bench: in-process model: %w", err)
	}
	var results []string
	for _, m := range req.Messages {
		if m.Role == abi.MessageTool {
			results = append(results, m.Content)
		}
	}
	out := abi.ModelOutcome{Message: abi.Message{Role: abi.MessageAssistant}, Usage: abi.Usage{InputTokens: 40, OutputTokens: 12}}
	if len(results) < len(benchSums) {
		for i, sum := range benchSums {
			args, _ := json.Marshal(map[string]string{"expression": sum})
			out.Message.ToolCalls = append(out.Message.ToolCalls, abi.ToolCall{ID: fmt.Sprintf("call_%d", i+1), Name: "calculate", Arguments: args})
		}
	} else {
		parts := make([]string, len(benchSums))
		for i, sum := range benchSums {
			parts[i] = sum + " = " + results[i]
		}
		out.Message.Content = strings.Join(parts, " and ") + "."
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return abi.EffectReply{}, err
	}
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}, nil
}

func (m inProcessModel) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return m.Start(ctx, c)
}

func (m inProcessModel) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return m.Start(ctx, c)
}

func (inProcessModel) Cancel(context.Context, runtime.EffectCall) (abi.CancelReply, error) {
	return abi.CancelReply{}, nil
}

// inProcessCalculator is calculator's twin for sums of two whole numbers.
type inProcessCalculator struct{}

func (inProcessCalculator) Start(_ context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	var req struct {
		Arguments struct {
			Expression string `json:"expression"`
		} `json:"arguments"`
	}
	_ = json.Unmarshal(c.Input.Effect.Request, &req)
	a, b, _ := strings.Cut(req.Arguments.Expression, "+")
	x, errA := strconv.Atoi(strings.TrimSpace(a))
	y, errB := strconv.Atoi(strings.TrimSpace(b))
	out := abi.ToolOutcome{Content: strconv.Itoa(x + y)}
	if errA != nil || errB != nil {
		out = abi.ToolOutcome{Content: fmt.Sprintf("cannot calculate %q", req.Arguments.Expression), IsError: true}
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return abi.EffectReply{}, err
	}
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}, nil
}

func (t inProcessCalculator) Poll(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return t.Start(ctx, c)
}

func (t inProcessCalculator) Attach(ctx context.Context, c runtime.EffectCall) (abi.EffectReply, error) {
	return t.Start(ctx, c)
}

func (inProcessCalculator) Cancel(context.Context, runtime.EffectCall) (abi.CancelReply, error) {
	return abi.CancelReply{}, nil
}

// inProcessTenant is the bench tenant on the in-process plugins, wired as
// the config of benchRunsConfig wires the Wasm ones (its limits, the
// metrics' timing under the same plugin names).
func inProcessTenant(m *metrics.Metrics) *runtime.Tenant {
	calc := abi.Tool{Name: "calculate", Description: "Evaluates an arithmetic expression.", Idempotent: true, Approval: abi.ApprovalNever,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`)}
	return &runtime.Tenant{
		ID:          benchTenant,
		Builder:     m.Builder(plugincatalog.PromptBuilder, inProcessBuilder{}),
		Model:       m.Executor(plugincatalog.ScriptedModel, inProcessModel{}),
		Limits:      loop.Limits{MaxSteps: 4, MaxToolCallsPerStep: 4, MaxParallelToolCalls: 4},
		ModelPolicy: loop.DefaultModelPolicy,
		Tools: []runtime.Tool{{Descriptor: calc, Executor: m.Executor(plugincatalog.Calculator, inProcessCalculator{}),
			Spec: loop.ToolSpec{Name: calc.Name, Policy: loop.DefaultToolPolicy(true)}}},
	}
}
