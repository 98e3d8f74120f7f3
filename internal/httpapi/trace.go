package httpapi

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/runtime"
)

// Traces (docs/DESIGN.md §5.10): every request is a server span, the
// child of the traceparent it came with. A Run submitted by the request
// is created under it (runtime.Submit), so the client's trace is the
// Run's. The server speaks only OpenTelemetry's API: the global
// propagator and TracerProvider, which internal/tracing installs; while
// it has not, no span is started.

// tracer makes the server's spans.
var tracer = otel.Tracer("github.com/agenthost/agenthost/internal/httpapi")

// startRequestSpan starts the span of request r, under the trace context
// its headers carry. The span is named by r's method (runtime.SpanMethod:
// one a client made up is "HTTP"), never by its path, which is anything
// the client likes; the path is an attribute, which the TracerProvider's
// limits bound (internal/tracing).
func startRequestSpan(r *http.Request) (context.Context, trace.Span) {
	if !runtime.TracingOn() {
		return r.Context(), runtime.OffSpan
	}
	ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	name, method := runtime.SpanMethod(r.Method)
	ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("http.request.method", method), attribute.String("url.path", r.URL.Path))
	}
	return ctx, span
}

// endRequestSpan ends the span of request r, answered with status: its
// name becomes "METHOD route" once the router has matched r (inner is the
// request the router saw).
func endRequestSpan(span trace.Span, inner *http.Request, status int, info *requestInfo) {
	if span.IsRecording() {
		if _, route, ok := strings.Cut(inner.Pattern, " "); ok {
			name, _ := runtime.SpanMethod(inner.Method)
			span.SetName(name + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		span.SetAttributes(attribute.Int("http.response.status_code", status), attribute.String("agenthost.request_id", info.requestID))
		if info.tenant != "" {
			span.SetAttributes(attribute.String("agenthost.tenant", info.tenant))
		}
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
		}
	}
	span.End()
}
