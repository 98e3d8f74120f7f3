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
// they live here. ModelReply and Calculate are their answers, exported
// for the peer bench (benchpeers), whose steps give the same ones.

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
	raw, err := json.Marshal(ModelReply(req))
	if err != nil {
		return abi.EffectReply{}, err
	}
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}, nil
}

// ModelReply is the in-process model's reply to req: until req holds a
// tool result for each of the bench question's sums, the calculate calls
// for all of them at once; then the answer, made of the results.
func ModelReply(req abi.ModelRequest) abi.ModelOutcome {
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
	return out
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
		Arguments json.RawMessage `json:"arguments"`
	}
	_ = json.Unmarshal(c.Input.Effect.Request, &req)
	raw, err := json.Marshal(Calculate(req.Arguments))
	if err != nil {
		return abi.EffectReply{}, err
	}
	return abi.EffectReply{State: abi.StateDone, Outcome: raw}, nil
}

// Calculate is the in-process calculator's outcome for a calculate call's
// arguments ({"expression": "2+3"}): the sum of two whole numbers, or an
// error outcome for anything else.
func Calculate(arguments json.RawMessage) abi.ToolOutcome {
	var args struct {
		Expression string `json:"expression"`
	}
	_ = json.Unmarshal(arguments, &args)
	a, b, _ := strings.Cut(args.Expression, "+")
	x, errA := strconv.Atoi(strings.TrimSpace(a))
	y, errB := strconv.Atoi(strings.TrimSpace(b))
	if errA != nil || errB != nil {
		return abi.ToolOutcome{Content: fmt.Sprintf("cannot calculate %q", args.Expression), IsError: true}
	}
	return abi.ToolOutcome{Content: strconv.Itoa(x + y)}
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
	calc := CalculateTool()
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

// CalculateTool is the calculate tool as calculator describes it.
func CalculateTool() abi.Tool {
	return abi.Tool{Name: "calculate", Description: "Evaluates an arithmetic expression.", Idempotent: true, Approval: abi.ApprovalNever,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`)}
}
