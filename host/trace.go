package host

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/runtime"
)

// Traces (docs/DESIGN.md §5.10): a span for each plugin call, and one for
// each request a plugin sends with agenthost_http or agenthost_http_open,
// whose context goes with the request as its W3C traceparent. The host
// speaks only OpenTelemetry's API: the spans go to the global
// TracerProvider and the header is written by the global propagator;
// while internal/tracing has installed neither, no span is started.

// tracer makes the host's spans.
var tracer = otel.Tracer("github.com/agenthost/agenthost/host")

// startCallSpan starts the span of one plugin call: the wait for an
// instance and the export's run.
func startCallSpan(ctx context.Context, s *callScope) (context.Context, trace.Span) {
	if !runtime.TracingOn() {
		return ctx, runtime.OffSpan
	}
	ctx, span := tracer.Start(ctx, "agenthost.plugin.call")
	if span.IsRecording() {
		span.SetAttributes(attribute.String("agenthost.plugin.name", s.plugin.name), attribute.String("agenthost.export", s.export),
			attribute.String("agenthost.tenant", s.tenant))
		if s.runID != "" {
			span.SetAttributes(attribute.String("agenthost.run.id", s.runID))
		}
		if s.effectID != "" {
			span.SetAttributes(attribute.String("agenthost.effect.id", s.effectID), attribute.Int("agenthost.effect.attempt", s.attempt))
		}
	}
	return ctx, span
}

// traceRequest starts the client span of a plugin's HTTP request, which
// lasts until the response's head has come, and writes its context into
// the request as traceparent (and tracestate), unless the plugin set a
// traceparent of its own.
func traceRequest(hr *http.Request) trace.Span {
	if !runtime.TracingOn() {
		return runtime.OffSpan
	}
	ctx, span := tracer.Start(hr.Context(), "HTTP "+hr.Method, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.request.method", hr.Method), attribute.String("server.address", hr.URL.Hostname()),
			attribute.String("url.scheme", hr.URL.Scheme), attribute.String("url.path", hr.URL.Path))
	}
	if hr.Header.Get("traceparent") == "" {
		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(hr.Header))
	}
	return span
}

// endRequestSpan ends a request's span with its response's status, or
// its error.
func endRequestSpan(span trace.Span, resp *http.Response, err error) {
	if span.IsRecording() && resp != nil {
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			span.SetStatus(codes.Error, resp.Status)
		}
	}
	runtime.EndSpan(span, err)
}
