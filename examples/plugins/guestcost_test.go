package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	scripted "github.com/agenthost/agenthost/examples/plugins/scripted-model/model"
	"github.com/agenthost/agenthost/host"
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

// benchRunQuestion is the question every Run of `agenthost bench runs`
// asks (internal/bench): two sums, so two calculate calls in one step.
const benchRunQuestion = "What is 2+3 and 4+5?"

// BenchmarkBenchRunGuestCalls measures the six guest calls of one Run of
// `agenthost bench runs`, each through the host's whole call path:
// prompt-builder's build and scripted-model's start at each of the Run's
// two model steps, and calculator's start for each of the two sums the
// model asks for between them. "run" makes the six in a row on the Go
// example plugins, with the inputs the runtime would give them; "run-c"
// makes them on the C builds, which a default `make run` loads; the
// others make one call each. The baseline, measured in the same run, is
// calculator-c's start of the same tool call (docs/BENCHMARKS.md, "Leaner
// guests").
func BenchmarkBenchRunGuestCalls(b *testing.B) {
	ctx := context.Background()
	e := newEnv(b)
	calcPlugin := e.load(b, "calculator", abi.RoleExecutor, nil)
	calcTools := calcPlugin.Describe().Tools
	calc, err := calcPlugin.Executor()
	if err != nil {
		b.Fatal(err)
	}
	modelX := e.executor(b, "scripted-model", nil)
	builder, err := e.load(b, "prompt-builder", abi.RoleBuilder, nil).Builder()
	if err != nil {
		b.Fatal(err)
	}
	calcC := e.executor(b, calculatorC, nil)
	modelC := e.executor(b, scriptedModelC, nil)
	builderC, err := e.load(b, promptBuilderC, abi.RoleBuilder, nil).Builder()
	if err != nil {
		b.Fatal(err)
	}

	// One Run, call by call, to record each call's input.
	transcript := []abi.Message{{Role: abi.MessageUser, Content: benchRunQuestion}}
	buildIn := func(step int) abi.BuildInput {
		return abi.BuildInput{
			Run:        abi.RunView{ID: "run_1", Tenant: "acme", Session: "s1", Step: step, Input: benchRunQuestion},
			Transcript: append([]abi.Message(nil), transcript...),
			Tools:      calcTools,
		}
	}
	build1 := buildIn(1)
	out, err := builder.Build(ctx, "acme", build1)
	if err != nil {
		b.Fatal(err)
	}
	model1 := modelCall("run_1.m1", out.Request)
	first := model(b)(modelX.Start(ctx, model1))
	if len(first.Message.ToolCalls) != 2 {
		b.Fatalf("the scripted model asked for %+v, not two calculations", first.Message)
	}
	transcript = append(transcript, first.Message)
	var calcs []runtime.EffectCall
	for i, tc := range first.Message.ToolCalls {
		c := toolCall(fmt.Sprintf("run_1.t1.%d", i), 1, tc.Name, json.RawMessage(tc.Arguments))
		calcs = append(calcs, c)
		o := tool(b)(calc.Start(ctx, c))
		transcript = append(transcript, abi.Message{Role: abi.MessageTool, ToolCallID: tc.ID, Content: o.Content})
	}
	build2 := buildIn(2)
	if out, err = builder.Build(ctx, "acme", build2); err != nil {
		b.Fatal(err)
	}
	model2 := modelCall("run_1.m2", out.Request)
	if answer := model(b)(modelX.Start(ctx, model2)); answer.Message.Content != "2+3 = 5 and 4+5 = 9." {
		b.Fatalf("the scripted model answered %+v", answer.Message)
	}

	doCalc := func(b *testing.B, x *host.Executor, c runtime.EffectCall) {
		if r, err := x.Start(ctx, c); err != nil || r.State != abi.StateDone {
			b.Fatalf("start: %+v %v", r, err)
		}
	}
	doBuild := func(b *testing.B, in abi.BuildInput) {
		if _, err := builder.Build(ctx, "acme", in); err != nil {
			b.Fatal(err)
		}
	}
	doModel := func(b *testing.B, c runtime.EffectCall) { doCalc(b, modelX, c) }
	doBuildC := func(b *testing.B, in abi.BuildInput) {
		if _, err := builderC.Build(ctx, "acme", in); err != nil {
			b.Fatal(err)
		}
	}
	for _, bm := range []struct {
		name string
		call func(b *testing.B)
	}{
		{"run", func(b *testing.B) {
			doBuild(b, build1)
			doModel(b, model1)
			doCalc(b, calc, calcs[0])
			doCalc(b, calc, calcs[1])
			doBuild(b, build2)
			doModel(b, model2)
		}},
		{"prompt-builder-build-1", func(b *testing.B) { doBuild(b, build1) }},
		{"scripted-model-start-1", func(b *testing.B) { doModel(b, model1) }},
		{"calculator-start", func(b *testing.B) { doCalc(b, calc, calcs[0]) }},
		{"prompt-builder-build-2", func(b *testing.B) { doBuild(b, build2) }},
		{"scripted-model-start-2", func(b *testing.B) { doModel(b, model2) }},
		{"baseline-calculator-c-start", func(b *testing.B) { doCalc(b, calcC, calcs[0]) }},
		// The C builds, which make run loads: the same six calls.
		{"run-c", func(b *testing.B) {
			doBuildC(b, build1)
			doCalc(b, modelC, model1)
			doCalc(b, calcC, calcs[0])
			doCalc(b, calcC, calcs[1])
			doBuildC(b, build2)
			doCalc(b, modelC, model2)
		}},
		{"scripted-model-c-start-1", func(b *testing.B) { doCalc(b, modelC, model1) }},
		{"scripted-model-c-start-2", func(b *testing.B) { doCalc(b, modelC, model2) }},
	} {
		b.Run(bm.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := processCPU(b)
			for b.Loop() {
				bm.call(b)
			}
			b.ReportMetric(float64(processCPU(b)-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
