package tracingtest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Record installs, for the rest of t, a global TracerProvider whose spans
// go to the returned in-memory recorder, and puts the provider before it
// back at t's end. A package's tracer delegates to the first provider
// ever installed, for good: a test that calls Record must be the first of
// its test binary to install one.
func Record(t testing.TB) *tracetest.SpanRecorder {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	off := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		otel.SetTracerProvider(off)
	})
	return rec
}
