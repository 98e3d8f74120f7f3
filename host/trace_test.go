package host

import (
	"net"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/tracing/tracingtest"
	"github.com/agenthost/agenthost/runtime"
)

// TestTraceRequestSpansKeepPluginSecrets: a plugin's request to a URL
// with a secret in its path and its query, once answered and once
// refused at the connection (whose client error spells the whole URL),
// leaves spans (and log lines) that name the destination's host and the failure's class,
// never the secret. It records spans with tracingtest.Record, which puts
// the off TracerProvider back at its end.
func TestTraceRequestSpansKeepPluginSecrets(t *testing.T) {
	const secret = "s3cr3t-T0KEN"
	rec := tracingtest.Record(t)
	if !runtime.TracingOn() {
		t.Fatal("tracing is not on with a TracerProvider installed")
	}

	web := newHTTPFixture(t)
	// A port nothing listens on: the request is refused at the dial.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	e, logs := newLoggedEnv(t)
	x := e.executor(t, conformance.PluginHostile, func(s *PluginSpec) {
		s.Sandbox.AllowedHosts = []string{"127.0.0.1:" + web.port, "127.0.0.1:" + closedPort}
	})
	answered := web.url("127.0.0.1", "/hello/"+secret+"?key="+secret)
	if msg := fetch(t, x, "r.t1.0", answered); msg != "" {
		t.Fatalf("GET %s: %s", answered, msg)
	}
	refused := "http://127.0.0.1:" + closedPort + "/v1/" + secret + "?key=" + secret
	if msg := fetch(t, x, "r.t1.1", refused); msg == "" {
		t.Fatalf("GET %s succeeded; want it refused", refused)
	}

	if strings.Contains(logs.String(), secret) {
		t.Errorf("the server's log carries the plugin's secret:\n%s", logs.String())
	}

	var requests int
	for _, s := range rec.Ended() {
		if s.SpanKind().String() == "client" {
			requests++
		}
		texts := []string{s.Name(), s.Status().Description}
		for _, a := range s.Attributes() {
			texts = append(texts, string(a.Key)+"="+a.Value.Emit())
		}
		for _, ev := range s.Events() {
			texts = append(texts, ev.Name)
			for _, a := range ev.Attributes {
				texts = append(texts, string(a.Key)+"="+a.Value.Emit())
			}
		}
		for _, text := range texts {
			if strings.Contains(text, secret) {
				t.Errorf("span %q carries the plugin's secret: %q", s.Name(), text)
			}
		}
		if s.SpanKind().String() == "client" && s.Status().Description != "" {
			if got := attr(s, "error.type"); got != "failed" {
				t.Errorf("the refused request's span: error.type %q, want failed", got)
			}
			if got := attr(s, "agenthost.http.destination"); got != "127.0.0.1:"+closedPort {
				t.Errorf("the refused request's span: destination %q, want 127.0.0.1:%s", got, closedPort)
			}
		}
	}
	if requests != 2 {
		t.Fatalf("%d request spans; want 2", requests)
	}
}

// attr is the value of span s's attribute key, "" when it has none.
func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.Emit()
		}
	}
	return ""
}
