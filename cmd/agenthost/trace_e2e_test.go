package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/tracing/tracingtest"
)

// TestServeTracesARunAcrossAKill9 is issue 38's done-when for traces,
// with real processes: `agenthost serve`, tracing on through the standard
// variables (OTEL_EXPORTER_OTLP_ENDPOINT to an in-process OTLP/HTTP
// receiver), runs a Run of agent research (the openai example against
// FakeOpenAI, then the slow-job tool) submitted with a client's
// traceparent. The Run's spans are in the client's trace: the request's,
// the submission's, the model call's with the GenAI attributes, the tool
// call's; the model request the plugin sent carried that trace's
// traceparent. The server is killed (SIGKILL) while the slow job is
// pending, and the next process, recovering on the same data dir,
// continues the same trace: its attach of the job, its second model
// call (whose request carries the trace too) and the Run's own span.
func TestServeTracesARunAcrossAKill9(t *testing.T) {
	conformance.SkipInShort(t, "SIGKILLing serve")
	recv := tracingtest.NewReceiver(t)
	t.Setenv("AGENTHOST_TRACING_ENABLED", "true")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "agenthost-e2e")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50") // ms: spans leave before the kill
	t.Setenv("OTEL_TRACES_SAMPLER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")

	fake := conformance.NewFakeOpenAI(t, "sk-test")
	fake.Script(func(req conformance.OpenAIRequest) (conformance.OpenAIAnswer, bool) {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == "user" && strings.HasPrefix(last.Text(), "slow ") {
			return conformance.OpenAIAnswer{ToolCalls: []conformance.OpenAIToolCall{
				conformance.OpenAICall("call_1", "slow_job", `{"seconds":`+strings.TrimPrefix(last.Text(), "slow ")+`}`)}}, true
		}
		return conformance.OpenAIAnswer{}, false // the tool's result: "done: ..."
	})
	bin := buildBinary(t)
	dir := t.TempDir()
	const token = "trace-token"
	cfg := providerServe{Token: token, Model: "openai", Addr: fake.Addr, URL: fake.URL,
		Config: "model: config-model, api_key: sk-test", Tools: []string{"slow-job"},
		Tenant: `    agents:
      research:
        model: {plugin: openai, settings: {model: gpt-traced}}
        tools: [{plugin: slow-job}]
`,
	}.write(t, dir)
	logPath := filepath.Join(dir, "serve.log")
	logTailOnFailure(t, logPath, 80)
	p := startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)

	// The client's trace: the Run must join it.
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	c := newClient(p.Addr(), token)
	var run runView
	code, raw, err := c.Do("POST", "/v1/sessions/s1/runs", map[string]any{"input": "slow 8", "agent": "research"},
		map[string]string{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}, &run)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("submit: %d %v %s", code, err, raw)
	}
	var traced struct {
		TraceID string `json:"trace_id"`
	}
	if err := json.Unmarshal(raw, &traced); err != nil || traced.TraceID != traceID {
		t.Fatalf("the Run's trace_id is %q (%v), want the client's %s", traced.TraceID, err, traceID)
	}
	c.waitRun(t, run.ID, 60*time.Second, "waiting on its slow job", func(r runView) bool {
		return r.Waiting != nil && len(r.Waiting.Pending) == 1 && r.Waiting.Pending[0].Tool == "slow_job"
	})
	first := p.Pid()
	spansOf := func(pid int) func() []tracingtest.Span {
		return func() []tracingtest.Span {
			var out []tracingtest.Span
			for _, s := range recv.Spans() {
				if s.Resource["process.pid"] == fmt.Sprint(pid) {
					out = append(out, s)
				}
			}
			return out
		}
	}
	before := waitSpans(t, spansOf(first), "the first process's spans of the Run",
		"POST /v1/sessions/{id}/runs", "agenthost.run.submit", "agenthost.model_step", "chat gpt-traced", "execute_tool slow_job")

	for _, s := range before {
		if s.Attrs["agenthost.run.id"] == run.ID && s.TraceID != traceID {
			t.Errorf("span %s of the Run is in trace %s, want the client's %s", s.Name, s.TraceID, traceID)
		}
	}
	model := spanNamed(before, "chat gpt-traced")
	for k, want := range map[string]string{
		"gen_ai.operation.name":      "chat",
		"gen_ai.request.model":       "gpt-traced",
		"gen_ai.provider.name":       "openai",
		"gen_ai.usage.output_tokens": "5",
		"agenthost.tenant":           "demo",
		"agenthost.agent":            "research",
		"agenthost.run.id":           run.ID,
		"agenthost.assignment_key":   "demo/s1/" + run.ID + ".m1#1",
		"agenthost.export":           "start",
	} {
		if got := model.Attrs[k]; got != want {
			t.Errorf("the model span's %s is %q, want %q (attributes %v)", k, got, want, model.Attrs)
		}
	}
	if n := model.Attrs["gen_ai.usage.input_tokens"]; n == "" || n == "0" {
		t.Errorf("the model span's gen_ai.usage.input_tokens is %q, want the tokens the fake counted", n)
	}
	if model.Kind != "SPAN_KIND_CLIENT" || model.Resource["service.name"] != "agenthost-e2e" {
		t.Errorf("the model span: kind %s, service %q", model.Kind, model.Resource["service.name"])
	}
	tool := spanNamed(before, "execute_tool slow_job")
	for k, want := range map[string]string{
		"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "slow_job", "gen_ai.tool.call.id": "call_1",
		"agenthost.agent": "research", "agenthost.export": "start", "agenthost.reply.state": "pending",
	} {
		if got := tool.Attrs[k]; got != want {
			t.Errorf("the tool span's %s is %q, want %q (attributes %v)", k, got, want, tool.Attrs)
		}
	}
	// The plugin's request to the model API carried the trace, as the
	// client span of its agenthost_http call.
	reqs := fake.Requests()
	if len(reqs) != 1 || !strings.HasPrefix(reqs[0].Traceparent, "00-"+traceID+"-") {
		t.Fatalf("the model API saw %d requests, the first with traceparent %q; want one, in trace %s", len(reqs), reqs[0].Traceparent, traceID)
	}
	if hop := spanNamed(before, "HTTP POST"); hop.TraceID != traceID || !strings.Contains(reqs[0].Traceparent, "-"+hop.SpanID+"-") {
		t.Errorf("the plugin's HTTP span %s/%s is not the traceparent %q", hop.TraceID, hop.SpanID, reqs[0].Traceparent)
	}

	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	mustExit(t, p, 30*time.Second)
	p = startServe(t, bin, cfg, logPath)
	mustReady(t, p, 90*time.Second)
	c = newClient(p.Addr(), token)
	done := c.waitRun(t, run.ID, 90*time.Second, "to end", runView.terminal)
	if done.Status != "completed" {
		t.Fatalf("the Run ended %s (%+v), want completed", done.Status, done.Failure)
	}
	after := waitSpans(t, spansOf(p.Pid()), "the restarted process's spans of the Run",
		"agenthost.recovery", "execute_tool slow_job", "chat gpt-traced", "agenthost.store.commit", "agenthost.run")
	for _, s := range after {
		if s.Attrs["agenthost.run.id"] == run.ID && s.TraceID != traceID {
			t.Errorf("after the restart, span %s of the Run is in trace %s, want the client's %s", s.Name, s.TraceID, traceID)
		}
	}
	if attach := spanNamed(after, "execute_tool slow_job"); attach.Attrs["agenthost.export"] != "attach" || attach.TraceID != traceID {
		t.Errorf("the restarted process's first call of the job: export %q in trace %s, want attach in %s", attach.Attrs["agenthost.export"], attach.TraceID, traceID)
	}
	if r := spanNamed(after, "agenthost.run"); r.Attrs["agenthost.run.status"] != "completed" || r.TraceID != traceID {
		t.Errorf("the Run's span: status %q, trace %s", r.Attrs["agenthost.run.status"], r.TraceID)
	}
	if reqs := fake.Requests(); len(reqs) != 2 || !strings.HasPrefix(reqs[1].Traceparent, "00-"+traceID+"-") {
		t.Errorf("the model API saw %d requests; the last carried traceparent %q, want trace %s", len(reqs), reqs[len(reqs)-1].Traceparent, traceID)
	}
}

// waitSpans waits until spans() holds a span of each name, and returns
// them.
func waitSpans(t *testing.T, spans func() []tracingtest.Span, what string, names ...string) []tracingtest.Span {
	t.Helper()
	var got []tracingtest.Span
	waitUntil(t, 30*time.Second, what, func() (bool, error) {
		got = spans()
		var missing []string
		for _, n := range names {
			if spanNamed(got, n).Name == "" {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, fmt.Errorf("no span %v among %d", missing, len(got))
	})
	return got
}

// spanNamed returns the first span named name, or the zero Span.
func spanNamed(spans []tracingtest.Span, name string) tracingtest.Span {
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	return tracingtest.Span{}
}
