package examples_test

import (
	"context"
	"encoding/json"
	"testing"

	scripted "github.com/agenthost/agenthost/examples/plugins/scripted-model/model"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// recoveredRun is what the three guest calls of a Run in `agenthost bench
// recovery` see after the restart: slow-job's attach of the job the model
// asked for, prompt-builder's build of the second model request, and
// scripted-model's answer to it.
type recoveredRun struct {
	job   runtime.EffectCall
	build abi.BuildInput
	model runtime.EffectCall
}

func newRecoveredRun(b testing.TB, slowJob *abi.Tool) recoveredRun {
	b.Helper()
	question := "Please run a slow job for 1 seconds"
	first := scripted.Respond(abi.ModelRequest{
		Messages: []abi.Message{{Role: abi.MessageUser, Content: question}},
		Tools:    []abi.Tool{*slowJob},
	})
	if len(first.Message.ToolCalls) != 1 {
		b.Fatalf("the scripted model asked for %+v, not one slow job", first.Message)
	}
	call := first.Message.ToolCalls[0]
	job := toolCall("run_1.t1.0", 1, call.Name, json.RawMessage(call.Arguments))
	transcript := []abi.Message{
		{Role: abi.MessageUser, Content: question},
		first.Message,
		{Role: abi.MessageTool, ToolCallID: call.ID, Content: `slow job "demo" finished after 1 s`},
	}
	in := abi.BuildInput{
		Run:        abi.RunView{ID: "run_1", Tenant: "acme", Session: "s1", Step: 2, Input: question},
		Transcript: transcript,
		Tools:      []abi.Tool{*slowJob},
	}
	return recoveredRun{job: job, build: in}
}

// BenchmarkRecoveredRunGuestCalls measures the three calls of one Run that
// `agenthost bench recovery` recovers, each through the host's whole call
// path, on the Go example plugins. The baseline, measured in the same run,
// is calculator-c's start: a C guest doing one tool call's JSON in and
// out, so the gap between the two is what the Go guests' own code costs
// (docs/BENCHMARKS.md, "What a recovered Run's guests cost").
func BenchmarkRecoveredRunGuestCalls(b *testing.B) {
	ctx := context.Background()
	e := newEnv(b)
	jobs := e.load(b, "slow-job", abi.RoleExecutor, nil)
	slowJob := jobs.Describe().Tools[0]
	jobX, err := jobs.Executor()
	if err != nil {
		b.Fatal(err)
	}
	modelX := e.executor(b, "scripted-model", nil)
	builder, err := e.load(b, "prompt-builder", abi.RoleBuilder, nil).Builder()
	if err != nil {
		b.Fatal(err)
	}
	run := newRecoveredRun(b, &slowJob)
	if r, err := jobX.Start(ctx, run.job); err != nil || r.State != abi.StatePending {
		b.Fatalf("start of the job: %+v %v", r, err)
	}
	out, err := builder.Build(ctx, "acme", run.build)
	if err != nil {
		b.Fatal(err)
	}
	run.model = modelCall("run_1.m2", out.Request)

	b.Run("slow-job-attach", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if r, err := jobX.Attach(ctx, run.job); err != nil || r.State != abi.StatePending {
				b.Fatalf("attach: %+v %v", r, err)
			}
		}
	})
	b.Run("prompt-builder-build", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := builder.Build(ctx, "acme", run.build); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("scripted-model-start", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if o := model(b)(modelX.Start(ctx, run.model)); o.Message.Content == "" {
				b.Fatalf("the model answered %+v, not the job's result", o.Message)
			}
		}
	})
	calc := e.executor(b, calculatorC, nil)
	c := toolCall("c1", 1, "calculate", map[string]string{"expression": "(2+3)*4"})
	b.Run("baseline-calculator-c-start", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if o := tool(b)(calc.Start(ctx, c)); o.Content != "20" {
				b.Fatalf("calculate: %+v", o)
			}
		}
	})
}
