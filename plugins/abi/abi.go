package abi

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Version is the major ABI version this package describes.
const Version = 1

// MarkerPrefix is the prefix of every version marker export. A plugin that
// speaks ABI vN exports a function named MarkerPrefix+"N" with no
// parameters and no results. The host reads it from the module's exports;
// it never calls it.
const MarkerPrefix = "agenthost_abi_v"

// Marker is the marker export of ABI v1.
const Marker = "agenthost_abi_v1"

// MarkerFor returns the marker export name of ABI version v.
func MarkerFor(v int) string { return fmt.Sprintf("%s%d", MarkerPrefix, v) }

// ParseMarker reports the ABI version named by an export, and whether the
// export is a version marker at all.
func ParseMarker(export string) (int, bool) {
	rest, ok := strings.CutPrefix(export, MarkerPrefix)
	if !ok || rest == "" || len(rest) > 4 {
		return 0, false
	}
	v := 0
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	if v == 0 || rest[0] == '0' {
		return 0, false
	}
	return v, true
}

// Plugin exports. Each takes its input through Extism's input, writes its
// output through Extism's output and returns an i32: 0 is ok, anything else
// a protocol error (with the message from Extism's error_set when the
// plugin called it).
const (
	ExportDescribe = "describe"
	ExportBuild    = "build"
	ExportStart    = "start"
	ExportPoll     = "poll"
	ExportAttach   = "attach"
	ExportCancel   = "cancel"
)

// Host functions, imported by plugins from module HostModule.
const (
	HostModule = "extism:host/user"
	ExtismEnv  = "extism:host/env"
	HostKVGet  = "agenthost_kv_get"
	HostKVSet  = "agenthost_kv_set"
	HostKVDel  = "agenthost_kv_delete"
	HostNowMS  = "agenthost_now_ms"
	HostEmit   = "agenthost_emit"
	HostHTTP   = "agenthost_http"
	// HostHTTPOpen, HostHTTPRead and HostHTTPClose read an HTTP response
	// as it arrives (docs/ABI.md, "agenthost_http_open, _read, _close").
	HostHTTPOpen  = "agenthost_http_open"
	HostHTTPRead  = "agenthost_http_read"
	HostHTTPClose = "agenthost_http_close"
	// HostInputRead and HostOutputSet move the call's input and output
	// between the host and the plugin's own memory in one call each,
	// rather than 8 bytes a call through the Extism kernel (docs/ABI.md,
	// "agenthost_input_read, agenthost_output_set"). Their arguments are
	// a pointer and a length in the plugin's memory, not Extism offsets.
	HostInputRead = "agenthost_input_read"
	HostOutputSet = "agenthost_output_set"
	wasmI64       = "i64"
	noParamType   = ""
)

// HostFunc describes the exact wasm signature of one host function.
type HostFunc struct {
	Name    string
	Params  []string // wasm value types, e.g. "i64"
	Results []string
}

// Signature renders the function type the way error messages show it:
// "(i64, i64) -> i64".
func (f HostFunc) Signature() string {
	return "(" + strings.Join(f.Params, ", ") + ") -> " + renderResults(f.Results)
}

func renderResults(rs []string) string {
	switch len(rs) {
	case 0:
		return "()"
	case 1:
		return rs[0]
	default:
		return "(" + strings.Join(rs, ", ") + ")"
	}
}

// HostFuncs lists every function the host offers in HostModule, with its
// exact wasm type. Every argument and result is an Extism memory offset
// (i64) unless the description in docs/ABI.md says otherwise (the
// pointers and lengths of HostInputRead and HostOutputSet).
var HostFuncs = []HostFunc{
	{Name: HostKVGet, Params: []string{wasmI64}, Results: []string{wasmI64}},
	{Name: HostKVSet, Params: []string{wasmI64, wasmI64}, Results: []string{wasmI64}},
	{Name: HostKVDel, Params: []string{wasmI64}, Results: []string{wasmI64}},
	{Name: HostNowMS, Params: nil, Results: []string{wasmI64}},
	{Name: HostEmit, Params: []string{wasmI64}, Results: []string{wasmI64}},
	{Name: HostHTTP, Params: []string{wasmI64}, Results: []string{wasmI64}},
	{Name: HostHTTPOpen, Params: []string{wasmI64}, Results: []string{wasmI64}},
	{Name: HostHTTPRead, Params: []string{wasmI64, wasmI64}, Results: []string{wasmI64}},
	{Name: HostHTTPClose, Params: []string{wasmI64}, Results: []string{wasmI64}},
	{Name: HostInputRead, Params: []string{wasmI64, wasmI64}, Results: []string{wasmI64}},
	{Name: HostOutputSet, Params: []string{wasmI64, wasmI64}, Results: nil},
}

// Status is the i64 status a host function returns.
type Status int64

// Host function status codes.
const (
	StatusOK               Status = 0
	StatusTooLarge         Status = 1 // the value, or the plugin's KV quota
	StatusStoreUnavailable Status = 2
	StatusRefused          Status = 3
)

// Role is what a plugin does.
type Role string

// Plugin roles.
const (
	RoleBuilder  Role = "builder"
	RoleExecutor Role = "executor"
)

// EffectKind is the kind of an effect: a model step or a tool call.
type EffectKind string

// Effect kinds.
const (
	KindModel EffectKind = "model"
	KindTool  EffectKind = "tool"
)

// Approval says whether a tool call waits for a person's approval before it
// is dispatched.
type Approval string

// Approval modes.
const (
	ApprovalNever  Approval = "never"
	ApprovalAlways Approval = "always"
)

// DescribeInput is the input of describe.
type DescribeInput struct {
	ABI int `json:"abi"`
}

// Describe is the reply of describe.
type Describe struct {
	ABI     int          `json:"abi"`
	Name    string       `json:"name"`
	Version string       `json:"version"`
	Role    Role         `json:"role"`
	Effects []EffectKind `json:"effects,omitempty"`
	Tools   []Tool       `json:"tools,omitempty"`
	Attach  bool         `json:"attach"`
	// AttachesFrom lists the earlier versions of this plugin whose effect
	// attempts this version can poll, attach to and cancel (it reads
	// their KV records and handles): when the version that started an
	// attempt is no longer loaded, the host gives the attempt to the one
	// in force only if it lists that version; otherwise the effect's
	// missing-effect policy decides. An addition to ABI v1: a plugin that
	// leaves it out takes over no other version's attempts.
	AttachesFrom []string `json:"attaches_from,omitempty"`
}

// TakesOver reports whether d declares it can take over the attempts of
// the given version of the same plugin (AttachesFrom); every version
// takes over its own.
func (d Describe) TakesOver(version string) bool {
	return version == d.Version || slices.Contains(d.AttachesFrom, version)
}

// Tool describes one tool that an executor offers, and that a builder
// passes on to the model.
type Tool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	Idempotent  bool            `json:"idempotent,omitempty"`
	Approval    Approval        `json:"approval,omitempty"`
}

// Message roles.
const (
	MessageSystem    = "system"
	MessageUser      = "user"
	MessageAssistant = "assistant"
	MessageTool      = "tool"
)

// Message is one message of a conversation, in the shape the builder and
// the model executor share.
type Message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// IsError is set on a tool message whose call failed (an addition to
	// the draft shape; plugins that ignore it see the error text only).
	IsError bool `json:"is_error,omitempty"`
}

// ToolCall is a model's request to call one tool.
type ToolCall struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// RunView is the part of a Run a builder sees.
type RunView struct {
	ID       string          `json:"id"`
	Tenant   string          `json:"tenant"`
	Session  string          `json:"session"`
	Step     int             `json:"step"`
	Input    string          `json:"input"`
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// BuildInput is the input of build.
type BuildInput struct {
	ABI        int       `json:"abi"`
	Run        RunView   `json:"run"`
	History    []Message `json:"history"`
	Transcript []Message `json:"transcript"`
	Tools      []Tool    `json:"tools"`
	// Agent is the agent the Run runs as, as it was when the Run was
	// created (an addition within v1: absent from an older host, and a
	// builder that ignores it still works). A builder puts its
	// instructions first, as the system message, and its settings into
	// request.params.
	Agent *AgentView `json:"agent,omitempty"`
}

// AgentView is the part of a Run's agent a builder sees.
type AgentView struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
	// Instructions are the system prompt; "" when the agent leaves it to
	// the builder's own config.
	Instructions string `json:"instructions,omitempty"`
	// Settings is a JSON object of model settings, for request.params:
	// "model", "temperature", "max_output_tokens", and whatever else the
	// operator set, passed through.
	Settings json.RawMessage `json:"settings,omitempty"`
	// OutputSchema is the JSON Schema (2020-12) the Run's final answer
	// must match, or absent (an addition within v1). The host checks
	// the answer and asks the model again when it fails; a builder
	// passes the schema on as request.params[ParamOutputSchema], so that
	// an executor that can constrain the model's output to it does.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
}

// ModelRequest is what a builder assembles and a model executor receives
// as effect.request.
type ModelRequest struct {
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
	// Params are the model settings the builder passes on, most often
	// its agent's settings as they are, and its output schema: the
	// executor reads the ones it knows (ParamModel, ParamTemperature,
	// ParamMaxOutputTokens, ParamOutputSchema) over its own config, and
	// ignores the rest.
	Params map[string]any `json:"params,omitempty"`
}

// The params a model executor reads, when present, over its own config.
const (
	// ParamModel is the model's name (a string).
	ParamModel = "model"
	// ParamTemperature is the sampling temperature (a number).
	ParamTemperature = "temperature"
	// ParamMaxOutputTokens bounds the tokens of one answer (an integer).
	ParamMaxOutputTokens = "max_output_tokens"
	// ParamOutputSchema is the JSON Schema the final answer must match (an
	// object: the agent's output schema, AgentView.OutputSchema).
	ParamOutputSchema = "output_schema"
)

// BuildOutput is the reply of build.
type BuildOutput struct {
	Request ModelRequest `json:"request"`
}

// Effect is the effect an executor call is about.
type Effect struct {
	ID            string          `json:"id"`
	AssignmentKey string          `json:"assignment_key"`
	Attempt       int             `json:"attempt"`
	Kind          EffectKind      `json:"kind"`
	Tool          string          `json:"tool,omitempty"`
	Request       json.RawMessage `json:"request"`
	DeadlineMS    int64           `json:"deadline_ms"`
}

// ToolRequest is effect.request for a tool effect.
type ToolRequest struct {
	Arguments json.RawMessage `json:"arguments"`
}

// EffectInput is the input of start, poll, attach and cancel.
type EffectInput struct {
	ABI    int    `json:"abi"`
	Effect Effect `json:"effect"`
	Handle string `json:"handle"`
}

// State is the state an executor reports for an effect.
type State string

// Effect states in replies. Cancel replies use StateCancelled, StateDone
// and StateUnknown.
const (
	StateDone      State = "done"
	StatePending   State = "pending"
	StateFailed    State = "failed"
	StateUnknown   State = "unknown"
	StateCancelled State = "cancelled"
)

// EffectReply is the reply of start, poll and attach.
type EffectReply struct {
	State       State           `json:"state"`
	Outcome     json.RawMessage `json:"outcome,omitempty"`
	Error       *ReplyError     `json:"error,omitempty"`
	Handle      string          `json:"handle,omitempty"`
	PollAfterMS int64           `json:"poll_after_ms,omitempty"`
}

// ReplyError is the error of a failed reply.
type ReplyError struct {
	Message   string `json:"message"`
	Retriable bool   `json:"retriable"`
	// Class says what kind of failure it is (an addition within v1): ""
	// or "plugin_failed" for a failure of the plugin's own, and
	// "rate_limited" (ClassRateLimited) when the provider behind it
	// refused the call for now, which is retriable whatever Retriable
	// says. A host settles any other value as plugin_failed (HostClass),
	// and a host older than the field ignores it: send Retriable true
	// with rate_limited, so that such a host retries too.
	Class ErrorClass `json:"class,omitempty"`
	// RetryAfterMS is how long the provider asked to wait before the
	// next attempt, in milliseconds (an addition within v1): 0 or absent
	// when it did not say. The Loop then dispatches no attempt earlier,
	// within the policy's max_retry_after. Never negative.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// CancelReply is the reply of cancel.
type CancelReply struct {
	State   State           `json:"state"`
	Outcome json.RawMessage `json:"outcome,omitempty"`
}

// Usage is a model step's token usage.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// Add returns u plus o.
func (u Usage) Add(o Usage) Usage {
	return Usage{InputTokens: u.InputTokens + o.InputTokens, OutputTokens: u.OutputTokens + o.OutputTokens}
}

// AwaitInput asks the user a question mid-Run.
type AwaitInput struct {
	Prompt string `json:"prompt"`
}

// ModelOutcome is the outcome of a model effect.
type ModelOutcome struct {
	Message    Message     `json:"message"`
	Usage      Usage       `json:"usage"`
	AwaitInput *AwaitInput `json:"await_input,omitempty"`
}

// ToolOutcome is the outcome of a tool effect.
type ToolOutcome struct {
	Content string `json:"content"`
	IsError bool   `json:"is_error"`
	// Usage is the model usage behind the outcome. The runtime sets it on
	// the outcome of an agent tool (a child Run's usage, which adds to
	// the parent's); a plugin's is ignored.
	Usage *Usage `json:"usage,omitempty"`
}

// The types of event agenthost_emit takes.
const (
	// EmitProgress is a plugin's progress, for people watching.
	EmitProgress = "progress"
	// EmitModelDelta is a model's partial output (EmitEvent.Delta), sent
	// by a model executor while the answer streams in.
	EmitModelDelta = "model_delta"
)

// EmitEvent is the argument of agenthost_emit.
type EmitEvent struct {
	Type    string          `json:"type"`
	Message string          `json:"message,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	// Delta is the partial output of an event of type EmitModelDelta.
	Delta *ModelDelta `json:"delta,omitempty"`
}

// ModelDelta is a piece of a model's answer as it streams in: the next
// piece of its text, and pieces of its tool calls. The pieces of one
// attempt, concatenated, are the answer the attempt's reply commits; the
// reply stays the only truth.
type ModelDelta struct {
	Text      string          `json:"text,omitempty"`
	ToolCalls []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ToolCallDelta is a piece of one tool call of a streaming answer.
type ToolCallDelta struct {
	// Index says which tool call of the answer, from 0.
	Index int `json:"index"`
	// ID and Name come with the call's first piece.
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// Arguments is the next piece of the arguments' JSON text.
	Arguments string `json:"arguments,omitempty"`
}

// HTTPRequest is the argument of agenthost_http.
type HTTPRequest struct {
	Method     string            `json:"method"`
	URL        string            `json:"url"`
	Headers    map[string]string `json:"headers,omitempty"`
	Body       string            `json:"body,omitempty"`
	BodyBase64 string            `json:"body_base64,omitempty"`
	TimeoutMS  int64             `json:"timeout_ms,omitempty"`
}

// HTTP error codes in HTTPResponse.Error.
const (
	HTTPDenied   = "denied"
	HTTPTimeout  = "timeout"
	HTTPTooLarge = "too_large"
	HTTPFailed   = "failed"
)

// HTTPError says why agenthost_http refused or failed a request.
type HTTPError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// HTTPResponse is the result of agenthost_http. A refused or failed
// request has Error set and Status 0.
type HTTPResponse struct {
	Status     int               `json:"status"`
	Headers    map[string]string `json:"headers,omitempty"`
	Body       string            `json:"body,omitempty"`
	BodyBase64 string            `json:"body_base64,omitempty"`
	Error      *HTTPError        `json:"error,omitempty"`
}

// HTTPStreamHead is the result of agenthost_http_open: the response's
// status and headers and the stream to read its body from, or, for a
// request refused or failed before a response came, Error with Status 0.
// A response of any status has a stream.
type HTTPStreamHead struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Stream  int64             `json:"stream,omitempty"`
	Error   *HTTPError        `json:"error,omitempty"`
}

// HTTPStreamEnd is the result of agenthost_http_close: Error says why
// reading the body failed; none when it was read to its end or the plugin
// closed it early.
type HTTPStreamEnd struct {
	Error *HTTPError `json:"error,omitempty"`
}

// ApprovalDecision is one approval or denial, addressed by tool call ID.
type ApprovalDecision struct {
	ToolCallID string `json:"tool_call_id"`
	Approved   bool   `json:"approved"`
	Reason     string `json:"reason,omitempty"`
}
