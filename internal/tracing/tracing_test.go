package tracing

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"

	"github.com/agenthost/agenthost/internal/config"
	"github.com/agenthost/agenthost/internal/tracing/tracingtest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestOffInstallsNothing: with tracing off (the default), and with it on
// but OTEL_SDK_DISABLED=true, Start leaves the global provider and
// propagator as they are (OpenTelemetry's no-ops in the server).
func TestOffInstallsNothing(t *testing.T) {
	for _, c := range []struct {
		name     string
		cfg      config.Tracing
		disabled string
	}{
		{"off", config.Tracing{ServiceName: config.DefaultServiceName}, ""},
		{"OTEL_SDK_DISABLED", config.Tracing{Enabled: true, Endpoint: "http://127.0.0.1:1", ServiceName: "x"}, "true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_SDK_DISABLED", c.disabled)
			provider, propagator := otel.GetTracerProvider(), fmt.Sprintf("%#v", otel.GetTextMapPropagator())
			stop, err := Start(context.Background(), c.cfg, "test", quiet)
			if err != nil {
				t.Fatal(err)
			}
			defer stop(context.Background())
			if otel.GetTracerProvider() != provider || fmt.Sprintf("%#v", otel.GetTextMapPropagator()) != propagator {
				t.Fatalf("tracing %s: Start installed a provider or a propagator", c.name)
			}
		})
	}
}

// TestSpansReachTheEndpoint: with tracing.enabled and tracing.endpoint
// set, a span ends up at the OTLP/HTTP receiver (its /v1/traces) once
// Stop flushes, under the config's service name, and the global
// propagator writes its traceparent.
func TestSpansReachTheEndpoint(t *testing.T) {
	recv := tracingtest.NewReceiver(t)
	t.Setenv("OTEL_SERVICE_NAME", "")
	stop, err := Start(context.Background(), config.Tracing{Enabled: true, Endpoint: recv.URL, ServiceName: "agenthost-unit"}, "v9", quiet)
	if err != nil {
		t.Fatal(err)
	}
	ctx, span := otel.Tracer("t").Start(context.Background(), "unit-span")
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	span.End()
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; carrier["traceparent"] != want {
		t.Errorf("traceparent %q, want %q", carrier["traceparent"], want)
	}
	spans := recv.Spans()
	if len(spans) != 1 || spans[0].Name != "unit-span" || spans[0].TraceID != sc.TraceID().String() {
		t.Fatalf("the receiver got %+v, want the one span unit-span of trace %s", spans, sc.TraceID())
	}
	if res := spans[0].Resource; res["service.name"] != "agenthost-unit" || res["service.version"] != "v9" {
		t.Errorf("the spans' resource %v, want service.name agenthost-unit, service.version v9", res)
	}
}

func TestTracesURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:4318":            "http://127.0.0.1:4318/v1/traces",
		"http://127.0.0.1:4318/":           "http://127.0.0.1:4318/v1/traces",
		"https://otel.example/x/v1/traces": "https://otel.example/x/v1/traces",
	} {
		if got, err := tracesURL(in); err != nil || got != want {
			t.Errorf("tracesURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// TestEndpointLoggedWithoutUserinfo: the log line at start names the
// endpoint without the user and password its URL may carry, from the
// config and from the SDK's variables alike; a tracing.endpoint that is
// not a URL is refused without its value.
func TestEndpointLoggedWithoutUserinfo(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	recv := tracingtest.NewReceiver(t)
	withUser := strings.Replace(recv.URL, "http://", "http://agent:hunter2@", 1)
	for _, c := range []struct {
		name, endpoint, env string
	}{
		{"tracing.endpoint", withUser, ""},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "", withUser},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.env)
			logs := &strings.Builder{}
			stop, err := Start(context.Background(), config.Tracing{Enabled: true, Endpoint: c.endpoint, ServiceName: "x"}, "test",
				slog.New(slog.NewTextHandler(logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer stop(context.Background())
			if strings.Contains(logs.String(), "hunter2") || strings.Contains(logs.String(), "agent@") {
				t.Errorf("the log names the endpoint's userinfo: %s", logs.String())
			}
			if !strings.Contains(logs.String(), strings.TrimPrefix(recv.URL, "http://")) {
				t.Errorf("the log does not name the endpoint %s: %s", recv.URL, logs.String())
			}
		})
	}
	_, err := Start(context.Background(), config.Tracing{Enabled: true, Endpoint: "http://agent:hunter2@collector:43x8", ServiceName: "x"}, "test", quiet)
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "tracing.endpoint") {
		t.Errorf("a tracing.endpoint that is not a URL: %v; want it refused, named, without its value", err)
	}
}

// TestAttributeValuesBounded: an attribute value longer than
// MaxAttributeValueLength reaches the receiver cut to it, unless
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT sets another bound.
func TestAttributeValuesBounded(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "")
	for _, c := range []struct {
		env  string
		want int
	}{{"", MaxAttributeValueLength}, {"1000", 1000}} {
		t.Run("limit="+c.env, func(t *testing.T) {
			t.Setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", c.env)
			recv := tracingtest.NewReceiver(t)
			stop, err := Start(context.Background(), config.Tracing{Enabled: true, Endpoint: recv.URL, ServiceName: "x"}, "test", quiet)
			if err != nil {
				t.Fatal(err)
			}
			_, span := otel.Tracer("t").Start(context.Background(), "long")
			span.SetAttributes(attribute.String("url.path", "/"+strings.Repeat("p", 4096)))
			span.End()
			if err := stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := recv.Spans()
			if len(spans) != 1 {
				t.Fatalf("the receiver got %d spans; want 1", len(spans))
			}
			if got := len(spans[0].Attrs["url.path"]); got != c.want {
				t.Fatalf("url.path of %d bytes reached the receiver; want it cut to %d", got, c.want)
			}
		})
	}
}
