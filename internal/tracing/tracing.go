// Package tracing installs OpenTelemetry's SDK for agenthost's traces:
// a TracerProvider that batches spans to an OTLP/HTTP receiver, and the
// W3C trace-context propagator, as the process's global ones, which the
// runtime, the host and the HTTP API reach through OpenTelemetry's API
// alone (docs/DESIGN.md §5.10). Nothing is installed while tracing is
// off, and the API's global no-ops then make every span a non-recording
// one.
//
// The export is configured the standard way: the SDK reads its own
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_*,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and
// its argument, OTEL_BSP_*, OTEL_SPAN_*_LIMIT), and the config's tracing keys
// (config.Tracing) come on top: tracing.endpoint over the endpoint
// variables, tracing.service_name under OTEL_SERVICE_NAME.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agenthost/agenthost/internal/config"
)

// Stop flushes the spans not yet exported and stops the export; it
// returns once they are sent, ctx ends or StopTimeout has passed (a
// receiver that is down does not hold a stopping process up).
type Stop func(ctx context.Context) error

// StopTimeout bounds the flush at Stop.
const StopTimeout = 5 * time.Second

// Start installs the SDK's TracerProvider and the trace-context
// propagator as the global ones when cfg turns tracing on (and
// OTEL_SDK_DISABLED does not turn it off), exporting to cfg's endpoint,
// and returns what flushes and stops it. With tracing off it installs
// nothing, and its Stop does nothing. Export errors are logged to log.
func Start(ctx context.Context, cfg config.Tracing, version string, log *slog.Logger) (Stop, error) {
	if !cfg.Enabled || strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return func(context.Context) error { return nil }, nil
	}
	var opts []otlptracehttp.Option
	if cfg.Endpoint != "" {
		u, err := tracesURL(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: the OTLP exporter: %w", err)
	}
	// The config's service name first, so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES (WithFromEnv) win over it.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", cfg.ServiceName), attribute.String("service.version", version)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID())
	if err != nil {
		return nil, fmt.Errorf("tracing: the spans' resource: %w", err)
	}
	// The sampler is the SDK's default, parent-based always-on, unless
	// OTEL_TRACES_SAMPLER names another (the SDK reads it here).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(spanLimits()))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: exporting spans failed; check tracing.endpoint or OTEL_EXPORTER_OTLP_ENDPOINT", "err", err)
	}))
	log.Info("tracing: spans are exported over OTLP/HTTP", "endpoint", endpointForLog(cfg.Endpoint), "service", cfg.ServiceName)
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, StopTimeout)
		defer cancel()
		return tp.Shutdown(ctx)
	}, nil
}

// MaxAttributeValueLength is the length, in bytes, a span's attribute
// value is cut to (the SDK cuts it at a character boundary) unless
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT sets another. Some values are chosen
// by whoever sends a request or a Run (a request's path, a model's or a
// tool's name), and a span must not grow with them.
const MaxAttributeValueLength = 256

// spanLimits are the SDK's span limits, as its OTEL_SPAN_* and
// OTEL_ATTRIBUTE_* variables set them, with attribute values bounded by
// MaxAttributeValueLength where they leave them unbounded.
func spanLimits() sdktrace.SpanLimits {
	limits := sdktrace.NewSpanLimits()
	if limits.AttributeValueLengthLimit < 0 {
		limits.AttributeValueLengthLimit = MaxAttributeValueLength
	}
	return limits
}

// tracesURL is the URL spans go to for a base URL: its /v1/traces, as the
// SDK derives it from OTEL_EXPORTER_OTLP_ENDPOINT. A URL with a path of
// its own is taken as it is.
func tracesURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		// Not the value itself, which may hold a password.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("tracing: tracing.endpoint is not a URL (%v): set it to the OTLP/HTTP receiver's base URL, as http://collector:4318", err)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String(), nil
}

// endpointForLog names where spans go, for the log line at start,
// without the userinfo of its URL (withoutUserinfo).
func endpointForLog(endpoint string) string {
	if endpoint != "" {
		return withoutUserinfo(endpoint)
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := os.Getenv(k); v != "" {
			return withoutUserinfo(v) + " (" + k + ")"
		}
	}
	return "https://localhost:4318 (the SDK's default)"
}

// withoutUserinfo is an endpoint's URL with its userinfo dropped: an
// endpoint written as http://user:password@collector:4318 must not put
// its password in the log. One that is not a URL is not logged at all.
func withoutUserinfo(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(not a URL)"
	}
	u.User = nil
	return u.String()
}
