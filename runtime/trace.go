package runtime

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Traces (docs/DESIGN.md §5.10). The runtime speaks only OpenTelemetry's
// API: its spans go to the global TracerProvider, a no-op until
// internal/tracing installs the SDK's. While none is installed
// (TracingOn), no span is started at all, and a span of a provider that
// does not record computes no attribute (span.IsRecording).
//
// A Run's trace is the one its creation joined: submit starts the span
// agenthost.run.submit under the caller's span (the HTTP request's, with
// the traceparent it came with, or a parent Run's tool call) and stores
// its context in the Run (loop.Spec.TraceParent). Every later span of the
// Run, on whichever node drives it, recovers it or takes it over, is a
// child of that stored context (runContext).

// tracer makes the runtime's spans.
var tracer = otel.Tracer("github.com/agenthost/agenthost/runtime")

// offProvider is the global TracerProvider before one is installed: the
// API's delegating no-op.
var offProvider = otel.GetTracerProvider()

// OffSpan is the span of everything traced while tracing is off
// (TracingOn): a no-op, started at no cost. The host and the HTTP API
// use it too.
var OffSpan = trace.SpanFromContext(context.Background())

// TracingOn reports whether a TracerProvider was installed as the global
// one (tracing.Start does, when tracing is on). While it is not, the
// runtime, the host and the HTTP API start no span, which would cost a
// context and a few allocations each for nothing.
func TracingOn() bool { return otel.GetTracerProvider() != offProvider }

// The attribute keys of the runtime's spans: agenthost's own, and those
// of OpenTelemetry's GenAI semantic conventions on model and tool calls.
const (
	attrTenant        = attribute.Key("agenthost.tenant")
	attrSession       = attribute.Key("agenthost.session")
	attrAgent         = attribute.Key("agenthost.agent")
	attrRunID         = attribute.Key("agenthost.run.id")
	attrRunStatus     = attribute.Key("agenthost.run.status")
	attrStep          = attribute.Key("agenthost.step")
	attrEffectID      = attribute.Key("agenthost.effect.id")
	attrAttempt       = attribute.Key("agenthost.effect.attempt")
	attrAssignmentKey = attribute.Key("agenthost.assignment_key")
	attrExport        = attribute.Key("agenthost.export")
	attrReplyState    = attribute.Key("agenthost.reply.state")
	attrEvents        = attribute.Key("agenthost.commit.events")
	attrRecovered     = attribute.Key("agenthost.recovery.sessions")
	attrOrphans       = attribute.Key("agenthost.recovery.orphans")

	attrGenAIOperation    = attribute.Key("gen_ai.operation.name")
	attrGenAIProvider     = attribute.Key("gen_ai.provider.name")
	attrGenAIModel        = attribute.Key("gen_ai.request.model")
	attrGenAIInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	attrGenAIOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	attrGenAIToolName     = attribute.Key("gen_ai.tool.name")
	attrGenAIToolCallID   = attribute.Key("gen_ai.tool.call.id")
	attrGenAIAgentName    = attribute.Key("gen_ai.agent.name")
)

// FormatTraceParent returns sc as a W3C traceparent (version 00:
// "00-<trace id>-<span id>-<flags>"), or "" when sc is not valid.
func FormatTraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + hex.EncodeToString([]byte{byte(sc.TraceFlags())})
}

// ParseTraceParent returns the remote span context a version-00 W3C
// traceparent names, as FormatTraceParent writes it; it is not valid when
// tp is "" or anything else.
func ParseTraceParent(tp string) trace.SpanContext {
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return trace.SpanContext{}
	}
	tid, err := trace.TraceIDFromHex(tp[3:35])
	if err != nil {
		return trace.SpanContext{}
	}
	sid, err := trace.SpanIDFromHex(tp[36:52])
	if err != nil {
		return trace.SpanContext{}
	}
	var flags [1]byte
	if _, err := hex.Decode(flags[:], []byte(tp[53:55])); err != nil {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
}

// runContext returns ctx with run's stored trace context as its remote
// parent, so that a span started from it belongs to the Run's trace
// whichever node starts it; ctx as it is when the Run has none.
func runContext(ctx context.Context, run *loop.Run) context.Context {
	if run.TraceParent == "" {
		return ctx
	}
	if sc := ParseTraceParent(run.TraceParent); sc.IsValid() {
		return trace.ContextWithRemoteSpanContext(ctx, sc)
	}
	return ctx
}

// runAttributes are the attributes every span of a Run carries.
func runAttributes(run *loop.Run) []attribute.KeyValue {
	return []attribute.KeyValue{attrTenant.String(run.Tenant), attrSession.String(run.Session),
		attrAgent.String(agentName(run)), attrRunID.String(run.ID)}
}

// startSubmitSpan starts the span of a Run's creation under ctx's span;
// the caller stores its context as the Run's trace (loop.Spec.TraceParent).
func startSubmitSpan(ctx context.Context, spec *loop.Spec) (context.Context, trace.Span) {
	if !TracingOn() {
		return ctx, OffSpan
	}
	ctx, span := tracer.Start(ctx, "agenthost.run.submit")
	if span.IsRecording() {
		name := DefaultAgent
		if spec.Agent != nil {
			name = spec.Agent.Name
		}
		span.SetAttributes(attrTenant.String(spec.Tenant), attrSession.String(spec.Session),
			attrAgent.String(name), attrRunID.String(spec.ID))
	}
	return ctx, span
}

// SpanMethod returns an HTTP request method as a span's name and as its
// http.request.method attribute: a standard method as it is, and any
// other, which the request's sender made up, as "HTTP" and "_OTHER", as
// OpenTelemetry's HTTP semantic conventions say. The HTTP API's spans and
// the host's spans of plugins' requests name their methods so.
func SpanMethod(method string) (name, attr string) {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method, method
	}
	return "HTTP", OtherHTTPMethod
}

// OtherHTTPMethod is the http.request.method of a request whose method
// is not a standard one (SpanMethod).
const OtherHTTPMethod = "_OTHER"

// maxSpanNamePart bounds the part of a span's name that comes from a
// Run's request: a model's or a tool's name (startEffectSpan).
const maxSpanNamePart = 128

// spanNamePart is s cut to at most maxSpanNamePart bytes, at a character
// boundary, for a span's name: a name the model or the builder chose must
// not make every span of a Run's trace as long as it likes. (Attributes
// are cut by the TracerProvider's limits, internal/tracing.)
func spanNamePart(s string) string {
	if len(s) <= maxSpanNamePart {
		return s
	}
	s = s[:maxSpanNamePart]
	for len(s) > 0 {
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// EndSpan ends span, marked as failed with err when there is one. The
// host and the HTTP API end their spans with it too.
func EndSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// traceRunEnded records the span agenthost.run of a Run that has just
// ended: from its creation to its terminal event, under its stored trace
// context. A Run's life may span several processes, so its span is
// recorded whole by the node that ends it.
func traceRunEnded(before, after *loop.Run) {
	if before.Status.Terminal() || !after.Status.Terminal() || after.TraceParent == "" || !TracingOn() {
		return
	}
	_, span := tracer.Start(runContext(context.Background(), after), "agenthost.run",
		trace.WithTimestamp(time.UnixMilli(after.CreatedAt)))
	if span.IsRecording() {
		span.SetAttributes(runAttributes(after)...)
		span.SetAttributes(attrRunStatus.String(string(after.Status)), attrStep.Int(after.Step),
			attrGenAIInputTokens.Int64(after.Usage.InputTokens), attrGenAIOutputTokens.Int64(after.Usage.OutputTokens))
		if after.Status == loop.StatusFailed && after.Failure != nil {
			span.SetStatus(codes.Error, after.Failure.Message)
		}
	}
	span.End(trace.WithTimestamp(time.UnixMilli(after.UpdatedAt)))
}

// startCommitSpan starts the span of one commit of a Run's events.
func startCommitSpan(ctx context.Context, run *loop.Run, events int) (context.Context, trace.Span) {
	if !TracingOn() {
		return ctx, OffSpan
	}
	ctx, span := tracer.Start(runContext(ctx, run), "agenthost.store.commit")
	if span.IsRecording() {
		span.SetAttributes(runAttributes(run)...)
		span.SetAttributes(attrEvents.Int(events))
	}
	return ctx, span
}

// startStepSpan starts the span of planning a Run's next model step: the
// builder's call.
func startStepSpan(ctx context.Context, run *loop.Run) (context.Context, trace.Span) {
	if !TracingOn() {
		return ctx, OffSpan
	}
	ctx, span := tracer.Start(runContext(ctx, run), "agenthost.model_step")
	if span.IsRecording() {
		span.SetAttributes(runAttributes(run)...)
		span.SetAttributes(attrStep.Int(run.Step + 1))
	}
	return ctx, span
}

// startEffectSpan starts the span of one executor call about an effect
// attempt (export: start, poll, attach or cancel). It follows the GenAI
// semantic conventions: a model call is "chat <model>" (or "chat"), a
// tool call "execute_tool <tool>", both of kind client, with the
// provider (the executor's endpoint) and the model the request names.
func startEffectSpan(ctx context.Context, run *loop.Run, e *loop.Effect, export string, exec Executor, call *EffectCall) (context.Context, trace.Span) {
	if !TracingOn() {
		return ctx, OffSpan
	}
	op := "execute_tool"
	if e.Kind == abi.KindModel {
		op = "chat"
	}
	ctx, span := tracer.Start(runContext(ctx, run), op, trace.WithSpanKind(trace.SpanKindClient))
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(runAttributes(run)...)
	span.SetAttributes(attrGenAIOperation.String(op), attrGenAIAgentName.String(agentName(run)),
		attrEffectID.String(e.ID), attrAttempt.Int(e.Attempt), attrExport.String(export),
		attrAssignmentKey.String(assignment(*run, e.ID, e.Attempt)))
	if provider := EndpointOf(exec); provider != "" {
		// An agent tool (a child Run) is the runtime's own: no provider.
		span.SetAttributes(attrGenAIProvider.String(provider))
	}
	if e.Kind != abi.KindModel {
		span.SetName(op + " " + spanNamePart(e.Tool))
		span.SetAttributes(attrGenAIToolName.String(e.Tool), attrGenAIToolCallID.String(e.ToolCallID))
		return ctx, span
	}
	var req struct {
		Params struct {
			Model string `json:"model"`
		} `json:"params"`
	}
	if call != nil && json.Unmarshal(call.Input.Effect.Request, &req) == nil && req.Params.Model != "" {
		span.SetName(op + " " + spanNamePart(req.Params.Model))
		span.SetAttributes(attrGenAIModel.String(req.Params.Model))
	}
	return ctx, span
}

// endEffectSpan ends an effect call's span with its reply: its state,
// and a model outcome's token usage.
func endEffectSpan(span trace.Span, e *loop.Effect, reply abi.EffectReply, err error) {
	if span.IsRecording() && err == nil {
		span.SetAttributes(attrReplyState.String(string(reply.State)))
		if e.Kind == abi.KindModel && reply.State == abi.StateDone {
			var out abi.ModelOutcome
			if json.Unmarshal(reply.Outcome, &out) == nil {
				span.SetAttributes(attrGenAIInputTokens.Int64(out.Usage.InputTokens), attrGenAIOutputTokens.Int64(out.Usage.OutputTokens))
			}
		}
		if reply.State == abi.StateFailed && reply.Error != nil {
			span.SetStatus(codes.Error, reply.Error.Message)
		}
	}
	EndSpan(span, err)
}

// startRecoverySpan starts the span of a recovery pass that began at
// began and found orphans sessions to take over. A pass is the node's own
// work, over many Runs: its span is the root of a trace of its own, and
// each attach it leads to is a span of its Run's trace.
func startRecoverySpan(ctx context.Context, began time.Time, orphans int) (context.Context, trace.Span) {
	if !TracingOn() {
		return ctx, OffSpan
	}
	ctx, span := tracer.Start(ctx, "agenthost.recovery", trace.WithNewRoot(), trace.WithTimestamp(began))
	span.SetAttributes(attrOrphans.Int(orphans))
	return ctx, span
}
