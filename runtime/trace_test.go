package runtime

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// BenchmarkTraceSpansOfARunOff is what tracing costs a Run while it is off
// (no SDK installed: the API's global no-ops): the spans one Run of
// `agenthost bench runs` starts and ends (its creation, 6 commits, 2 model
// steps, 4 executor calls, its end), with their attributes, which are not
// computed. Compare its ns/op with a Run's time in `bench runs`
// (docs/BENCHMARKS.md, "Traces off"):
//
//	go test -run '^$' -bench TraceSpansOfARunOff -benchmem ./runtime
func BenchmarkTraceSpansOfARunOff(b *testing.B) {
	if TracingOn() {
		b.Fatal("a TracerProvider is installed")
	}
	benchRunSpans(b, "")
}

// BenchmarkTraceSpansOfARunOn is the same with tracing on: the SDK's
// TracerProvider, sampling every span, with its batching processor and an
// exporter that drops what it is given, so that what is measured is the
// spans' making, not their sending.
//
//	go test -run '^$' -bench TraceSpansOfARun -benchmem ./runtime
func BenchmarkTraceSpansOfARunOn(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(dropExporter{}))
	otel.SetTracerProvider(tp)
	defer func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(offProvider)
	}()
	benchRunSpans(b, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
}

// dropExporter exports nowhere.
type dropExporter struct{}

func (dropExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropExporter) Shutdown(context.Context) error                             { return nil }

// benchRunSpans starts and ends the spans of one bench Run per iteration,
// the Run in the trace traceparent names ("" for none).
func benchRunSpans(b *testing.B, traceparent string) {
	run := loop.Run{Spec: loop.Spec{Tenant: "t", Session: "s", ID: "run_1", TraceParent: traceparent}, Step: 1}
	model := loop.Effect{ID: "run_1.m1", Kind: abi.KindModel, Attempt: 1}
	tool := loop.Effect{ID: "run_1.t1.0", Kind: abi.KindTool, Tool: "calculate", Attempt: 1}
	call := &EffectCall{Input: abi.EffectInput{Effect: abi.Effect{Request: []byte(`{"params":{"model":"m"}}`)}}}
	done := run
	done.Status = loop.StatusCompleted
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		spec := run.Spec
		_, span := startSubmitSpan(ctx, &spec)
		spec.TraceParent = FormatTraceParent(span.SpanContext())
		EndSpan(span, nil)
		for range 6 {
			_, span := startCommitSpan(ctx, &run, 3)
			EndSpan(span, nil)
		}
		for range 2 {
			_, span := startStepSpan(ctx, &run)
			EndSpan(span, nil)
			_, span = startEffectSpan(ctx, &run, &model, abi.ExportStart, nil, call)
			endEffectSpan(span, &model, abi.EffectReply{State: abi.StateDone}, nil)
			_, span = startEffectSpan(ctx, &run, &tool, abi.ExportStart, nil, call)
			endEffectSpan(span, &tool, abi.EffectReply{State: abi.StateDone}, nil)
		}
		traceRunEnded(&run, &done)
		if (spec.TraceParent != "") != (traceparent != "") {
			b.Fatalf("tracing on %v stored trace context %q", traceparent != "", spec.TraceParent)
		}
	}
}

// TestTraceParentRoundTrips: the traceparent a Run stores reads back as
// the same span context, remote, and anything else reads as none.
func TestTraceParentRoundTrips(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc := ParseTraceParent(tp)
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() || FormatTraceParent(sc) != tp {
		t.Fatalf("%s reads as %+v and writes back as %q", tp, sc, FormatTraceParent(sc))
	}
	if unsampled := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"; FormatTraceParent(ParseTraceParent(unsampled)) != unsampled {
		t.Errorf("an unsampled traceparent does not round-trip")
	}
	for _, bad := range []string{"", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tp + "-x",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"00-4bf92f3577b34da6a3ce929d0e0e473z-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz"} {
		if sc := ParseTraceParent(bad); sc.IsValid() {
			t.Errorf("%q reads as a valid span context %+v", bad, sc)
		}
	}
}

// TestSpanNamePartBounded: a model's or a tool's name goes into a span's
// name whole up to maxSpanNamePart bytes, and is cut there beyond it, at
// a character boundary.
func TestSpanNamePartBounded(t *testing.T) {
	if got := spanNamePart("gpt-x"); got != "gpt-x" {
		t.Fatalf("a short name became %q", got)
	}
	long := strings.Repeat("a", maxSpanNamePart-1) + "é" + strings.Repeat("b", 4096)
	got := spanNamePart(long)
	if len(got) > maxSpanNamePart || !utf8.ValidString(got) || !strings.HasPrefix(long, got) || len(got) < maxSpanNamePart-3 {
		t.Fatalf("a name of %d bytes became %d bytes (valid UTF-8 %v): want a prefix of at most %d, cut at a character", len(long), len(got), utf8.ValidString(got), maxSpanNamePart)
	}
	if got := spanNamePart(strings.Repeat("a", maxSpanNamePart+10)); len(got) != maxSpanNamePart {
		t.Fatalf("an ASCII name was cut to %d bytes; want %d", len(got), maxSpanNamePart)
	}
}

// TestSpanMethod: the standard methods name a span as they are; one a
// client made up is "HTTP" in the name and "_OTHER" in the attribute.
func TestSpanMethod(t *testing.T) {
	for method, want := range map[string][2]string{
		"GET": {"GET", "GET"}, "POST": {"POST", "POST"}, "DELETE": {"DELETE", "DELETE"}, "PATCH": {"PATCH", "PATCH"},
		"get": {"HTTP", "_OTHER"}, "FROBNICATE": {"HTTP", "_OTHER"}, strings.Repeat("X", 10000): {"HTTP", "_OTHER"},
	} {
		if name, attr := SpanMethod(method); name != want[0] || attr != want[1] {
			t.Errorf("SpanMethod(%.20q) = %q, %q; want %q, %q", method, name, attr, want[0], want[1])
		}
	}
}
