package httpapi

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/tracing/tracingtest"
)

// TestRequestSpanMethodBounded: a request whose method a client made up
// (any token, of any length) is the span "HTTP", with
// http.request.method "_OTHER"; a standard one names its span. It
// records spans with tracingtest.Record, which puts the off
// TracerProvider back at its end.
func TestRequestSpanMethodBounded(t *testing.T) {
	rec := tracingtest.Record(t)
	made := strings.Repeat("FROBNICATE", 1000)
	for _, method := range []string{made, "GET"} {
		r := httptest.NewRequest(method, "/v1/sessions", nil)
		_, span := startRequestSpan(r)
		endRequestSpan(span, r, 404, &requestInfo{requestID: "req_1"})
	}
	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended; want 2", len(ended))
	}
	for i, want := range [][2]string{{"HTTP", "_OTHER"}, {"GET", "GET"}} {
		s := ended[i]
		var method string
		for _, a := range s.Attributes() {
			if a.Key == "http.request.method" {
				method = a.Value.AsString()
			}
		}
		if s.Name() != want[0] || method != want[1] {
			t.Errorf("span %.40q with http.request.method %.40q; want %q, %q", s.Name(), method, want[0], want[1])
		}
	}
}
