package loop

import (
	"encoding/json"

	"github.com/agenthost/agenthost/plugins/abi"
)

// Status is a Run's status: pending → running ⇄ waiting → completed |
// failed | cancelled.
type Status string

// Run statuses.
const (
	StatusPending   Status = "pending"
	StatusRunning   Status = "running"
	StatusWaiting   Status = "waiting"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is an end state.
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// PolicyMode is a missing-effect policy: what happens when an executor says
// unknown, or an attempt fails as retriable.
type PolicyMode string

// Missing-effect policies.
const (
	// PolicyRetry dispatches the effect again as the next attempt, after a
	// backoff, up to MaxAttempts; after the last attempt it acts as fail.
	PolicyRetry PolicyMode = "retry"
	// PolicyFail settles the effect as failed (the model sees a tool
	// error; a failed model step fails the Run).
	PolicyFail PolicyMode = "fail"
	// PolicyFailRun fails the whole Run.
	PolicyFailRun PolicyMode = "fail_run"
)

// Policy is a missing-effect policy with its retry parameters.
//
// Under retry, an attempt that failed retriably is followed by the next
// one after a wait (RetryWait): the backoff, or longer when the failure
// carries a retry_after that asks for longer, up to MaxRetryAfterMS. A
// failure of class rate_limited counts against MaxRateLimitedAttempts,
// any other against MaxAttempts: a provider that says "not now" for a
// while does not use up the attempts meant for faults.
type Policy struct {
	Mode         PolicyMode `json:"mode"`
	MaxAttempts  int        `json:"max_attempts,omitempty"`
	BackoffMS    int64      `json:"backoff_ms,omitempty"`
	MaxBackoffMS int64      `json:"max_backoff_ms,omitempty"`
	// MaxRateLimitedAttempts is how many attempts of one effect may fail
	// as rate_limited: the last of them fails the effect. 0 takes
	// DefaultMaxRateLimitedAttempts (a Run created before the field has
	// 0).
	MaxRateLimitedAttempts int `json:"max_rate_limited_attempts,omitempty"`
	// MaxRetryAfterMS is the longest wait a failure's retry_after sets
	// before the next attempt: a provider that asks for longer gets this
	// wait, after which the attempt goes ahead (and is answered again).
	// 0 takes DefaultMaxRetryAfterMS.
	MaxRetryAfterMS int64 `json:"max_retry_after_ms,omitempty"`
}

// The defaults of the Policy fields whose zero value takes one.
const (
	// DefaultMaxRateLimitedAttempts lets an effect be rate-limited 20
	// times: with the default backoff (1 s doubling to 30 s, which a
	// retry_after can only lengthen) the attempts span more than 8
	// minutes, so a Run outlasts a provider's 5-minute rate-limit window.
	DefaultMaxRateLimitedAttempts = 20
	// DefaultMaxRetryAfterMS honours a provider's retry_after up to 5
	// minutes.
	DefaultMaxRetryAfterMS int64 = 5 * 60 * 1000
)

// RateLimitedAttempts is p's budget of rate-limited attempts:
// MaxRateLimitedAttempts, or its default.
func (p Policy) RateLimitedAttempts() int {
	if p.MaxRateLimitedAttempts > 0 {
		return p.MaxRateLimitedAttempts
	}
	return DefaultMaxRateLimitedAttempts
}

// RetryAfterCapMS is the longest wait p lets a retry_after set:
// MaxRetryAfterMS, or its default.
func (p Policy) RetryAfterCapMS() int64 {
	if p.MaxRetryAfterMS > 0 {
		return p.MaxRetryAfterMS
	}
	return DefaultMaxRetryAfterMS
}

// DefaultModelPolicy retries a model step up to 3 attempts.
var DefaultModelPolicy = Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000}

// DefaultToolPolicy is the policy of a tool that declares nothing: fail,
// unless the tool is idempotent, in which case it retries.
func DefaultToolPolicy(idempotent bool) Policy {
	if idempotent {
		return Policy{Mode: PolicyRetry, MaxAttempts: 3, BackoffMS: 1000, MaxBackoffMS: 30_000}
	}
	return Policy{Mode: PolicyFail}
}

// ToolSpec is what the Loop knows of a tool: whether a call waits for
// approval, its missing-effect policy, and the JSON Schema its arguments
// must match.
type ToolSpec struct {
	Name     string `json:"name"`
	Approval bool   `json:"approval,omitempty"`
	Policy   Policy `json:"policy"`
	// InputSchema is the tool's input_schema from its describe reply. When
	// set, a call whose arguments fail it settles at once as
	// invalid_arguments and is never dispatched (arguments.go).
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
	// Descriptor is the tool as the Run's builder shows it to the model
	// (name, description, input schema...), pinned when the Run is created
	// so that the builder offers the tools the Loop accepts calls of, as
	// they were then, whatever the tenant's tools have become since. It is
	// nil in a Run created before descriptors were pinned.
	Descriptor *abi.Tool `json:"descriptor,omitempty"`
	// Agent, when set, makes the tool another agent of the Run's tenant:
	// a call of it runs as a child Run of that agent (ChildRunID names
	// it), carried out by the runtime itself, and settles with the child's
	// result. A child's usage adds to the Run's.
	Agent string `json:"agent,omitempty"`
}

// Limits bound a Run.
type Limits struct {
	// MaxSteps is the number of model steps a Run may take; the Run fails
	// with limit_exceeded when it would need one more.
	MaxSteps int `json:"max_steps"`
	// MaxToolCallsPerStep fails the Run when one model message asks for
	// more tool calls.
	MaxToolCallsPerStep int `json:"max_tool_calls_per_step"`
	// MaxParallelToolCalls is a concurrency window, not a failure: the calls
	// beyond it wait their turn.
	MaxParallelToolCalls int `json:"max_parallel_tool_calls"`
	// DeadlineMS is the Unix time in milliseconds after which the Run fails
	// with deadline_exceeded; 0 means none.
	DeadlineMS int64 `json:"deadline_ms,omitempty"`
	// EffectTimeoutMS bounds how long one attempt may stay executing
	// without an outcome; past it the attempt fails as plugin_timeout
	// (retriable, so the policy applies). 0 means none.
	EffectTimeoutMS int64 `json:"effect_timeout_ms,omitempty"`
	// RunTimeoutMS bounds the Run's work time: the time since its
	// creation that it did not spend waiting for a person (StatusWaiting).
	// Once the work time reaches it, the Run fails with deadline_exceeded;
	// the clock stops while the Run waits (wait.go). 0 means none. A Run
	// created before it existed has DeadlineMS instead, which keeps its
	// meaning.
	RunTimeoutMS int64 `json:"run_timeout_ms,omitempty"`
	// WaitTimeoutMS bounds each wait for a person on its own: a Run that
	// waits that long, from the event that made it wait, fails with
	// deadline_exceeded. 0 means none.
	WaitTimeoutMS int64 `json:"wait_timeout_ms,omitempty"`
}

// DefaultLimits are the limits of a Run that sets none.
var DefaultLimits = Limits{MaxSteps: 16, MaxToolCallsPerStep: 16, MaxParallelToolCalls: 4}

// Spec is everything RunCreated carries: who the Run belongs to, its input
// and the rules it runs under.
type Spec struct {
	Tenant      string          `json:"tenant"`
	Session     string          `json:"session"`
	ID          string          `json:"id"`
	Input       string          `json:"input"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
	Limits      Limits          `json:"limits"`
	ModelPolicy Policy          `json:"model_policy"`
	Tools       []ToolSpec      `json:"tools,omitempty"`
	// Agent is the agent the Run was created for, as it was then: the
	// builder is given its instructions and settings for the Run's whole
	// life, whatever the agent has become since. It is nil in a Run
	// created before agents were pinned, which runs as its tenant's
	// default agent is now.
	Agent *AgentPin `json:"agent,omitempty"`
	// Parent is set on a child Run, started by a call of an agent tool of
	// another Run: the call it answers. It is nil on a Run submitted from
	// outside.
	Parent *ParentRef `json:"parent,omitempty"`
	// TraceParent is the W3C traceparent of the Run's trace
	// ("00-<trace id>-<span id>-<flags>"): the span that created the Run,
	// the parent of every span of the Run on any node, so that a takeover
	// or a recovery continues the same trace (docs/DESIGN.md §5.10). It is
	// "" when tracing was off at the Run's creation, and in a Run created
	// before it was recorded.
	TraceParent string `json:"traceparent,omitempty"`
}

// ParentRef names the tool call a child Run answers: the parent Run, the
// effect attempt whose ID the child's is derived from (ChildRunID), and
// how deep the child is (1 for the child of a Run with no parent).
type ParentRef struct {
	Run        string `json:"run"`
	Session    string `json:"session"`
	Effect     string `json:"effect"`
	Attempt    int    `json:"attempt"`
	ToolCallID string `json:"tool_call_id,omitempty"`
	Depth      int    `json:"depth"`
}

// ChildRef names a child Run a Run started: one per dispatched attempt
// of an agent tool, recorded when the attempt is dispatched.
type ChildRef struct {
	Run        string `json:"run"`
	Agent      string `json:"agent"`
	Effect     string `json:"effect"`
	Attempt    int    `json:"attempt"`
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// AgentPin is what a Run keeps of its agent: the agent's name, by which
// the runtime finds the executors of its effects, and the version,
// instructions, settings and output schema the Run was created with.
type AgentPin struct {
	Name string `json:"name"`
	// Version is the hash of the agent's resolved definition when the
	// Run was created ("" for an agent that has none).
	Version      string `json:"version,omitempty"`
	Instructions string `json:"instructions,omitempty"`
	// Settings is a JSON object, passed to the builder as they are (the
	// model's name, temperature, max_output_tokens...).
	Settings json.RawMessage `json:"settings,omitempty"`
	// OutputSchema is the agent's output schema (JSON Schema 2020-12),
	// or nil: when set, the Run's final answer must be one JSON value
	// that matches it, or the model is told why and asked again
	// (output.go).
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
}

// EffectState is the state of one effect.
type EffectState string

// Effect states.
const (
	EffectAwaitingApproval EffectState = "awaiting_approval"
	EffectReady            EffectState = "ready"     // may be dispatched
	EffectExecuting        EffectState = "executing" // dispatched, no outcome yet
	EffectBackoff          EffectState = "backoff"   // an attempt failed; the next waits until NotBefore
	EffectSettled          EffectState = "settled"
)

// OutcomeState is how an effect ended.
type OutcomeState string

// Outcome states.
const (
	OutcomeDone      OutcomeState = "done"
	OutcomeFailed    OutcomeState = "failed"
	OutcomeCancelled OutcomeState = "cancelled"
)

// Failure is a classified error.
type Failure struct {
	Class     abi.ErrorClass `json:"class"`
	Message   string         `json:"message"`
	Retriable bool           `json:"retriable,omitempty"`
	// RetryAfterMS is the wait before the next attempt that the executor
	// (its provider) asked for, in milliseconds; 0 when it said nothing.
	// The Loop dispatches no retry of the attempt earlier, within the
	// policy's MaxRetryAfterMS (RetryWait).
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// RateLimited reports whether f is a provider's "not now": class
// rate_limited, retriable. Such failures count against the policy's
// MaxRateLimitedAttempts, not MaxAttempts.
func (f *Failure) RateLimited() bool {
	return f != nil && f.Retriable && f.Class == abi.ClassRateLimited
}

func (f *Failure) Error() string { return string(f.Class) + ": " + f.Message }

// Outcome is what an effect attempt settled with.
type Outcome struct {
	State OutcomeState      `json:"state"`
	Model *abi.ModelOutcome `json:"model,omitempty"`
	Tool  *abi.ToolOutcome  `json:"tool,omitempty"`
	Error *Failure          `json:"error,omitempty"`
}

// Effect is one model step or tool call of the current step.
type Effect struct {
	ID         string          `json:"id"`
	Kind       abi.EffectKind  `json:"kind"`
	Step       int             `json:"step"`
	Index      int             `json:"index,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	Tool       string          `json:"tool,omitempty"`
	Arguments  json.RawMessage `json:"arguments,omitempty"`
	// RequestSeq is, for a model effect, the position in the event log of
	// the ModelStepPlanned event that holds its request.
	RequestSeq   int64       `json:"request_seq,omitempty"`
	State        EffectState `json:"state"`
	Attempt      int         `json:"attempt,omitempty"` // the last dispatched attempt; 0 before the first
	Epoch        uint64      `json:"epoch,omitempty"`   // the owner epoch that dispatched it
	Handle       string      `json:"handle,omitempty"`
	DispatchedAt int64       `json:"dispatched_at,omitempty"`
	NotBefore    int64       `json:"not_before,omitempty"`
	Outcome      *Outcome    `json:"outcome,omitempty"`
	// Failures counts the attempts that failed and fell under the policy.
	Failures int `json:"failures,omitempty"`
	// RateLimited counts those of them that failed as rate_limited
	// (Failure.RateLimited). They count against the policy's
	// MaxRateLimitedAttempts; the others (Attempt - RateLimited) against
	// its MaxAttempts.
	RateLimited int `json:"rate_limited,omitempty"`
	// DeferredSince is when recovery first deferred the current attempt
	// because its executor was unavailable (EffectDeferred); 0 when it was
	// not, or once it was attached again.
	DeferredSince int64 `json:"deferred_since,omitempty"`
	// Plugin is the plugin version that holds the current attempt: the
	// one its effect_dispatched named, or the one an effect_pending of a
	// takeover named since; nil when the executor is not a plugin, or the
	// attempt was dispatched before versions were recorded.
	Plugin *PluginRef `json:"plugin,omitempty"`
}

// Verdict is the end a Run is heading to. Once set, nothing new is
// dispatched; the effects in flight are cancelled, and when none is left
// Decide asks for the matching terminal event.
type Verdict struct {
	Status  Status   `json:"status"`
	Result  string   `json:"result,omitempty"`
	Failure *Failure `json:"failure,omitempty"`
}

// Run is the snapshot of one Run: everything the Loop needs to decide, and
// nothing it can re-read from the event log.
type Run struct {
	Spec
	Status     Status        `json:"status"`
	Seq        int64         `json:"seq"` // the number of events applied
	CreatedAt  int64         `json:"created_at"`
	UpdatedAt  int64         `json:"updated_at"`
	Step       int           `json:"step"` // the number of model steps planned
	Transcript []abi.Message `json:"transcript"`
	// Effects holds the effects of the current step: its model effect
	// first, then its tool calls in the order the model asked for them.
	Effects  []Effect        `json:"effects,omitempty"`
	Usage    abi.Usage       `json:"usage"`
	Awaiting *abi.AwaitInput `json:"awaiting,omitempty"`
	Verdict  *Verdict        `json:"verdict,omitempty"`
	Result   string          `json:"result,omitempty"`
	Failure  *Failure        `json:"failure,omitempty"`
	// Children are the child Runs the Run's agent tools started, in the
	// order their attempts were dispatched.
	Children []ChildRef `json:"children,omitempty"`
	// ChildrenUsage is the part of Usage that came from child Runs (the
	// usage of agent tools' outcomes): Usage less it is what the Run's own
	// model steps used. A tenant's token count adds each Run's own usage
	// once, so a child's tokens are not counted twice.
	ChildrenUsage abi.Usage `json:"children_usage,omitempty"`
	// WaitingSince is when the Run's current wait for a person began: the
	// time of the event that made it StatusWaiting. It is 0 when the Run
	// does not wait, or has waited since before this was recorded.
	WaitingSince int64 `json:"waiting_since,omitempty"`
	// WaitedMS is the time the Run spent waiting for a person in the
	// waits that are over; Limits.RunTimeoutMS does not count it.
	WaitedMS int64 `json:"waited_ms,omitempty"`
}

// OwnUsage is the usage of the Run's own model steps: Usage less what its
// child Runs used (ChildrenUsage). Summing OwnUsage over a tenant's Runs
// counts every token once.
func (r Run) OwnUsage() abi.Usage {
	return abi.Usage{InputTokens: r.Usage.InputTokens - r.ChildrenUsage.InputTokens,
		OutputTokens: r.Usage.OutputTokens - r.ChildrenUsage.OutputTokens}
}

// Effect returns a pointer into r.Effects for id, or nil.
func (r *Run) Effect(id string) *Effect {
	for i := range r.Effects {
		if r.Effects[i].ID == id {
			return &r.Effects[i]
		}
	}
	return nil
}

// Executing returns the effects that are dispatched and have no outcome.
func (r *Run) Executing() []Effect {
	var out []Effect
	for _, e := range r.Effects {
		if e.State == EffectExecuting {
			out = append(out, e)
		}
	}
	return out
}

// ToolSpec returns the spec of tool name, or false.
func (r *Run) ToolSpec(name string) (ToolSpec, bool) {
	for _, t := range r.Tools {
		if t.Name == name {
			return t, true
		}
	}
	return ToolSpec{}, false
}

// Clone returns a deep enough copy of r that mutating the copy's effects
// or appending to its transcript leaves r untouched.
func (r Run) Clone() Run {
	r.Effects = append([]Effect(nil), r.Effects...)
	r.Children = r.Children[:len(r.Children):len(r.Children)]
	r.Transcript = r.Transcript[:len(r.Transcript):len(r.Transcript)]
	return r
}
