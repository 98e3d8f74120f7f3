package host

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/plugins/abi"
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
// traceparent of its own. The span is "HTTP METHOD", or "HTTP" for a
// method outside the standard ones (runtime.SpanMethod). A plugin's URL may carry its secrets (an API
// key in the query, a token in the path): the span names only the
// destination's host and scheme, as the rest of agenthost_http's answers
// name only the destination.
func traceRequest(hr *http.Request) trace.Span {
	if !runtime.TracingOn() {
		return runtime.OffSpan
	}
	name, method := runtime.SpanMethod(hr.Method)
	if method != runtime.OtherHTTPMethod {
		name = "HTTP " + method
	}
	ctx, span := tracer.Start(hr.Context(), name, trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.request.method", method), attribute.String("server.address", hr.URL.Hostname()),
			attribute.String("url.scheme", hr.URL.Scheme))
	}
	if hr.Header.Get("traceparent") == "" {
		otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(hr.Header))
	}
	return span
}

// endRequestSpan ends a request's span with its response's status, or
// with the class of its failure (error.type) and the destination of its
// last hop, dest. It never records the client's error, whose text holds
// the whole URL.
func endRequestSpan(span trace.Span, resp *http.Response, dest string, failure *abi.HTTPError) {
	if span.IsRecording() {
		switch {
		case failure != nil:
			span.SetAttributes(attribute.String("error.type", failure.Code), attribute.String("agenthost.http.destination", dest))
			span.SetStatus(codes.Error, failure.Code)
		case resp != nil:
			span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
			if resp.StatusCode >= 500 {
				span.SetStatus(codes.Error, resp.Status)
			}
		}
	}
	span.End()
}
