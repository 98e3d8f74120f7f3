package tracingtest

import (
	"context"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// recording is the TracerProvider Record installs, the same one every
// time. A package's tracer (otel.Tracer, called at its init) delegates,
// for good, to the first TracerProvider ever installed as the global one;
// recording hands each span to the SDK provider of the test under way, so
// that any number of a test binary's tests may record, and a test may run
// more than once (go test -count).
var recording = &switchProvider{}

// probe is a tracer made before any provider is installed, as a
// package's is: Record checks through it that its spans reach the test.
var probe = otel.Tracer("github.com/agenthost/agenthost/internal/tracing/tracingtest")

// Record installs, for the rest of t, a global TracerProvider whose spans
// go to the returned in-memory recorder, and puts the provider before it
// back at t's end. One test at a time may record (not parallel ones), and
// no other TracerProvider may be installed before the first Record of its
// test binary: the packages' tracers would go on delegating to that one.
// Record checks both, and the recorder starts with one span started, not
// ended: its check's.
func Record(t testing.TB) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	if !recording.target.CompareAndSwap(nil, tp) {
		t.Fatal("tracingtest: another test is recording spans; tests that call Record must not run in parallel")
	}
	off := otel.GetTracerProvider()
	otel.SetTracerProvider(recording)
	t.Cleanup(func() {
		otel.SetTracerProvider(off)
		recording.target.Store(nil)
		_ = tp.Shutdown(context.Background())
	})
	if _, span := probe.Start(context.Background(), "tracingtest.probe"); !span.IsRecording() || len(rec.Started()) != 1 {
		t.Fatal("tracingtest: the packages' tracers do not reach the recorder: a TracerProvider other than Record's was installed first in this test binary; record its spans with Record instead")
	}
	return rec
}

// switchProvider is the TracerProvider Record installs: its tracers start
// each span with the SDK provider of the test that is recording, and a
// non-recording one when none is.
type switchProvider struct {
	embedded.TracerProvider
	target atomic.Pointer[sdktrace.TracerProvider]
}

func (p *switchProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return &switchTracer{p: p, name: name, opts: opts}
}

type switchTracer struct {
	embedded.Tracer
	p    *switchProvider
	name string
	opts []trace.TracerOption
}

func (t *switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if tp := t.p.target.Load(); tp != nil {
		return tp.Tracer(t.name, t.opts...).Start(ctx, name, opts...)
	}
	return noop.Tracer{}.Start(ctx, name, opts...)
}
