package abi

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Errors of the Validate and Decode functions. Check them with errors.Is.
var (
	// ErrInvalidReply: a plugin's reply breaks ABI v1. It is malformed
	// JSON, a field has the wrong JSON type, or a value is one the contract
	// does not allow. The host classifies it as plugin_protocol. Every
	// *FieldError wraps it.
	ErrInvalidReply = errors.New("abi: invalid reply")
	// ErrUnsupportedVersion: describe answered with an "abi" other than
	// Version. It comes wrapped together with ErrInvalidReply.
	ErrUnsupportedVersion = errors.New("abi: unsupported abi version")
	// ErrRoleMismatch: describe names a valid role, but not the one the
	// plugin was loaded for. It comes wrapped together with
	// ErrInvalidReply.
	ErrRoleMismatch = errors.New("abi: role mismatch")
	// ErrInvalidArgument: the caller of a Validate or Decode function
	// passed a kind, an export or a role that ABI v1 does not have. The
	// bug is the caller's, not the plugin's, so it never wraps
	// ErrInvalidReply.
	ErrInvalidArgument = errors.New("abi: invalid argument")
)

// FieldError says which field of which reply breaks the ABI, and how. It
// wraps ErrInvalidReply, the more precise sentinel when there is one
// (ErrUnsupportedVersion, ErrRoleMismatch), and the JSON error that caused
// it, if any.
type FieldError struct {
	// Reply names what was checked: "describe reply", "build reply",
	// "start reply", "poll reply", "attach reply", "cancel reply", "model
	// outcome" or "tool outcome".
	Reply string
	// Field is the JSON path of the offending field, such as
	// "outcome.message.tool_calls[1].name"; empty for the reply as a whole.
	Field string
	// Problem says what is wrong and, where it can, what to send instead.
	Problem string
	// Cause is the JSON decoding error behind the problem, or nil.
	Cause error

	sentinel error
}

// Error renders "abi: <reply>: <field>: <problem>".
func (e *FieldError) Error() string {
	if e.Field == "" {
		return "abi: " + e.Reply + ": " + e.Problem
	}
	return "abi: " + e.Reply + ": " + e.Field + ": " + e.Problem
}

// Unwrap returns ErrInvalidReply, the precise sentinel if any, and Cause if
// any.
func (e *FieldError) Unwrap() []error {
	errs := []error{ErrInvalidReply}
	if e.sentinel != nil {
		errs = append(errs, e.sentinel)
	}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// MaxToolNameLen is the longest tool name.
const MaxToolNameLen = 64

// ValidToolName reports whether name matches [A-Za-z0-9_-]{1,64}, the
// grammar of tool names (the one model APIs accept for function names).
func ValidToolName(name string) bool {
	if len(name) == 0 || len(name) > MaxToolNameLen {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// ValidateDescribe checks a describe reply. wantRole is the role the
// plugin is loaded for; "" accepts either role.
//
// It checks that abi is Version; name is not blank; role is builder or
// executor (and wantRole, when set); a builder lists no effects and no
// tools; an executor lists its effects, each "model" or "tool" and none
// twice; a tool executor offers at least one tool and only a tool executor
// offers tools; and every tool is valid (see ValidateBuildOutput for the
// tool rules).
func ValidateDescribe(d Describe, wantRole Role) error {
	if err := checkWantRole("ValidateDescribe", wantRole); err != nil {
		return err
	}
	c := checker{reply: ExportDescribe + " reply"}
	if d.ABI != Version {
		e := c.errf("abi", "is %d, but this host speaks ABI v%d: answer describe with \"abi\": %d", d.ABI, Version, Version)
		e.sentinel = ErrUnsupportedVersion
		return e
	}
	if strings.TrimSpace(d.Name) == "" {
		return c.errf("name", "is empty; give the plugin a name")
	}
	switch d.Role {
	case RoleBuilder, RoleExecutor:
	case "":
		return c.errf("role", "is missing (want %q or %q)", RoleBuilder, RoleExecutor)
	default:
		return c.errf("role", "%q is not a role (want %q or %q)", d.Role, RoleBuilder, RoleExecutor)
	}
	if wantRole != "" && d.Role != wantRole {
		e := c.errf("role", "is %q, but the plugin is loaded as %s; load it where %s is wanted", d.Role, withArticle(wantRole), withArticle(d.Role))
		e.sentinel = ErrRoleMismatch
		return e
	}
	seenVersions := map[string]bool{}
	for i, v := range d.AttachesFrom {
		if strings.TrimSpace(v) == "" {
			return c.errf(index("attaches_from", i), "is blank; list the versions (as their describe's \"version\" says) whose attempts this version can take over")
		}
		if seenVersions[v] {
			return c.errf(index("attaches_from", i), "%q is listed twice; list each version once", v)
		}
		seenVersions[v] = true
	}
	if d.Role == RoleBuilder {
		if len(d.Effects) > 0 {
			return c.errf("effects", "a builder carries out no effects; leave the field out")
		}
		if len(d.Tools) > 0 {
			return c.errf("tools", "a builder offers no tools (it passes on the tools it is given); leave the field out")
		}
		return nil
	}
	if len(d.Effects) == 0 {
		return c.errf("effects", "is empty; an executor lists the kinds it carries out, %q and/or %q", KindModel, KindTool)
	}
	seen := map[EffectKind]int{}
	for i, k := range d.Effects {
		p := index("effects", i)
		if k != KindModel && k != KindTool {
			return c.errf(p, "%q is not an effect kind (want %q or %q)", k, KindModel, KindTool)
		}
		if j, dup := seen[k]; dup {
			return c.errf(p, "%q is listed twice (also effects[%d])", k, j)
		}
		seen[k] = i
	}
	_, tools := seen[KindTool]
	switch {
	case tools && len(d.Tools) == 0:
		return c.errf("tools", "is empty; an executor of %q effects offers at least one tool", KindTool)
	case !tools && len(d.Tools) > 0:
		return c.errf("tools", "only an executor of %q effects offers tools; add %q to effects or leave tools out", KindTool, KindTool)
	}
	return c.tools("tools", d.Tools)
}

// ValidateBuildOutput checks a build reply.
//
// The request holds at least one message. Every message has a known role
// (system, user, assistant or tool); only an assistant message carries
// tool_calls, each with a name and, when present, arguments that are a
// JSON object, and no tool call ID twice; a tool message carries the
// tool_call_id it answers. Every tool has a name matching
// [A-Za-z0-9_-]{1,64}, no name twice, an approval of "", "never" or
// "always", and, when present, an input_schema that is a JSON object whose
// "type" is "object".
func ValidateBuildOutput(o BuildOutput) error {
	c := checker{reply: ExportBuild + " reply"}
	msgs := o.Request.Messages
	if len(msgs) == 0 {
		return c.errf("request.messages", "is empty; a model request needs at least one message")
	}
	for i, m := range msgs {
		p := index("request.messages", i)
		switch m.Role {
		case MessageSystem, MessageUser, MessageAssistant, MessageTool:
		case "":
			return c.errf(p+".role", "is missing (want system, user, assistant or tool)")
		default:
			return c.errf(p+".role", "%q is not a message role (want system, user, assistant or tool)", m.Role)
		}
		if len(m.ToolCalls) > 0 && m.Role != MessageAssistant {
			return c.errf(p+".tool_calls", "only an assistant message carries tool calls; this one is a %s message", m.Role)
		}
		if m.Role == MessageTool && m.ToolCallID == "" {
			return c.errf(p+".tool_call_id", "is empty; a tool message names the tool call it answers")
		}
		if err := c.toolCalls(p+".tool_calls", m.ToolCalls); err != nil {
			return err
		}
	}
	return c.tools("request.tools", o.Request.Tools)
}

// ValidateEffectReply checks the reply of export (start, poll or attach)
// for an effect of the given kind.
//
//   - state is done, pending, failed or unknown; start may not answer
//     unknown, because it was just handed the effect.
//   - done carries an outcome: a ModelOutcome for a model effect, a
//     ToolOutcome for a tool effect (see DecodeModelOutcome and
//     DecodeToolOutcome for their rules).
//   - failed carries an error whose message is not blank. Its class, when
//     present, is any string: the host settles one it does not take from
//     a plugin as plugin_failed (ReplyError.HostClass).
//   - pending may carry a handle or not. The host passes back whatever
//     came, and a plugin must find its record by (effect.id, attempt)
//     anyway, because attach and cancel can arrive with no handle.
//   - poll_after_ms is never negative; 0 lets the host choose. Nor is
//     error.retry_after_ms, whatever the state.
//
// Fields that do not belong to the state (an outcome on failed, an error
// on done) are ignored.
func ValidateEffectReply(r EffectReply, kind EffectKind, export string) error {
	if err := checkKind("ValidateEffectReply", kind); err != nil {
		return err
	}
	if err := checkEffectExport("ValidateEffectReply", export); err != nil {
		return err
	}
	c := checker{reply: export + " reply"}
	switch r.State {
	case StateDone:
		if err := c.outcome("outcome", r.Outcome, kind); err != nil {
			return err
		}
	case StateFailed:
		if r.Error == nil {
			return c.errf("error", "is missing; a failed reply carries {\"message\": \"…\", \"retriable\": false}")
		}
		if strings.TrimSpace(r.Error.Message) == "" {
			return c.errf("error.message", "is empty; say what went wrong")
		}
	case StatePending:
	case StateUnknown:
		if export == ExportStart {
			return c.errf("state", "start cannot answer %q, because it was just handed the effect; answer done, pending or failed", StateUnknown)
		}
	case StateCancelled:
		return c.errf("state", "%q answers cancel only; %s answers done, pending, failed or unknown", StateCancelled, export)
	case "":
		return c.errf("state", "is missing (want done, pending, failed or unknown)")
	default:
		return c.errf("state", "%q is not a state (want done, pending, failed or unknown)", r.State)
	}
	if r.PollAfterMS < 0 {
		return c.errf("poll_after_ms", "is %d; send 0 (the host chooses) or more", r.PollAfterMS)
	}
	if r.Error != nil && r.Error.RetryAfterMS < 0 {
		return c.errf("error.retry_after_ms", "is %d; send the wait the provider asked for, in milliseconds, or leave it out", r.Error.RetryAfterMS)
	}
	return nil
}

// ValidateCancelReply checks the reply of cancel for an effect of the given
// kind: state is cancelled, done or unknown, and done carries a valid
// outcome, which the effect then settles with.
func ValidateCancelReply(r CancelReply, kind EffectKind) error {
	if err := checkKind("ValidateCancelReply", kind); err != nil {
		return err
	}
	c := checker{reply: ExportCancel + " reply"}
	switch r.State {
	case StateCancelled, StateUnknown:
		return nil
	case StateDone:
		return c.outcome("outcome", r.Outcome, kind)
	case "":
		return c.errf("state", "is missing (want cancelled, done or unknown)")
	default:
		return c.errf("state", "%q is not a cancel state (want cancelled, done or unknown)", r.State)
	}
}

// ValidateModelOutcome checks the outcome of a model effect: the message's
// role is "assistant" or empty (the host reads empty as assistant); every
// tool call has a name, arguments that are a JSON object when present, and
// an ID used by no other call of the message (an empty ID is allowed, and
// the host assigns one); token counts are not negative.
func ValidateModelOutcome(m ModelOutcome) error {
	return checker{reply: "model outcome"}.modelOutcome("", m)
}

// withArticle renders a role with its indefinite article: "a builder",
// "an executor".
func withArticle(r Role) string {
	if r == RoleExecutor {
		return "an " + string(r)
	}
	return "a " + string(r)
}

// checker builds the FieldErrors of one reply.
type checker struct{ reply string }

func (c checker) errf(field, format string, args ...any) *FieldError {
	return &FieldError{Reply: c.reply, Field: field, Problem: fmt.Sprintf(format, args...)}
}

func checkKind(fn string, kind EffectKind) error {
	if kind != KindModel && kind != KindTool {
		return fmt.Errorf("%w: %s: kind %q is not an effect kind (want %q or %q)", ErrInvalidArgument, fn, kind, KindModel, KindTool)
	}
	return nil
}

func checkWantRole(fn string, wantRole Role) error {
	switch wantRole {
	case "", RoleBuilder, RoleExecutor:
		return nil
	}
	return fmt.Errorf("%w: %s: wantRole %q is not a role (want %q, %q or empty)", ErrInvalidArgument, fn, wantRole, RoleBuilder, RoleExecutor)
}

func checkEffectExport(fn, export string) error {
	switch export {
	case ExportStart, ExportPoll, ExportAttach:
		return nil
	}
	return fmt.Errorf("%w: %s: export %q does not answer with an effect reply (want %q, %q or %q)",
		ErrInvalidArgument, fn, export, ExportStart, ExportPoll, ExportAttach)
}

// outcome decodes and checks the outcome of a done reply.
func (c checker) outcome(path string, raw json.RawMessage, kind EffectKind) error {
	if absent(raw) {
		return c.errf(path, "is missing; a done reply carries the %s outcome", kind)
	}
	if kind == KindModel {
		_, err := c.decodeModelOutcome(path, raw)
		return err
	}
	_, err := c.decodeToolOutcome(path, raw)
	return err
}

func (c checker) decodeModelOutcome(path string, raw json.RawMessage) (ModelOutcome, error) {
	var m ModelOutcome
	if err := c.decodeObject(path, raw, &m); err != nil {
		return ModelOutcome{}, err
	}
	if err := c.modelOutcome(path, m); err != nil {
		return ModelOutcome{}, err
	}
	return m, nil
}

func (c checker) decodeToolOutcome(path string, raw json.RawMessage) (ToolOutcome, error) {
	var t ToolOutcome
	if err := c.decodeObject(path, raw, &t); err != nil {
		return ToolOutcome{}, err
	}
	return t, nil
}

func (c checker) modelOutcome(path string, m ModelOutcome) error {
	if r := m.Message.Role; r != "" && r != MessageAssistant {
		return c.errf(join(path, "message.role"), "is %q; a model answers as %q (or leaves the role empty)", r, MessageAssistant)
	}
	if err := c.toolCalls(join(path, "message.tool_calls"), m.Message.ToolCalls); err != nil {
		return err
	}
	if m.Usage.InputTokens < 0 {
		return c.errf(join(path, "usage.input_tokens"), "is %d; token counts are never negative", m.Usage.InputTokens)
	}
	if m.Usage.OutputTokens < 0 {
		return c.errf(join(path, "usage.output_tokens"), "is %d; token counts are never negative", m.Usage.OutputTokens)
	}
	return nil
}

func (c checker) toolCalls(path string, calls []ToolCall) error {
	ids := map[string]int{}
	for i, tc := range calls {
		p := index(path, i)
		if strings.TrimSpace(tc.Name) == "" {
			return c.errf(p+".name", "is empty; name the tool to call")
		}
		if tc.ID != "" {
			if j, dup := ids[tc.ID]; dup {
				return c.errf(p+".id", "%q is used twice (also %s); approvals and tool results are addressed by it", tc.ID, index(path, j))
			}
			ids[tc.ID] = i
		}
		if !absent(tc.Arguments) && !isObject(tc.Arguments) {
			return c.errf(p+".arguments", "must be a JSON object (the tool's input), got %s", jsonKind(tc.Arguments))
		}
	}
	return nil
}

func (c checker) tools(path string, tools []Tool) error {
	names := map[string]int{}
	for i, t := range tools {
		p := index(path, i)
		if !ValidToolName(t.Name) {
			return c.errf(p+".name", "%q must match [A-Za-z0-9_-]{1,64}", t.Name)
		}
		if j, dup := names[t.Name]; dup {
			return c.errf(p+".name", "%q is offered twice (also %s)", t.Name, index(path, j))
		}
		names[t.Name] = i
		switch t.Approval {
		case "", ApprovalNever, ApprovalAlways:
		default:
			return c.errf(p+".approval", "%q is not an approval mode (want %q, %q or empty)", t.Approval, ApprovalNever, ApprovalAlways)
		}
		if err := c.inputSchema(p+".input_schema", t.InputSchema); err != nil {
			return err
		}
	}
	return nil
}

// inputSchema checks that a tool's input schema, when present, is a JSON
// Schema for an object: a JSON object whose "type" is "object".
func (c checker) inputSchema(path string, raw json.RawMessage) error {
	if absent(raw) {
		return nil
	}
	if !isObject(raw) {
		return c.errf(path, "must be a JSON Schema object such as {\"type\": \"object\", \"properties\": {…}}, got %s", jsonKind(raw))
	}
	var s struct {
		Type json.RawMessage `json:"type"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return &FieldError{Reply: c.reply, Field: path, Problem: "is not valid JSON", Cause: err}
	}
	var typ string
	if absent(s.Type) || json.Unmarshal(s.Type, &typ) != nil || typ != "object" {
		got := "missing"
		if !absent(s.Type) {
			got = string(s.Type)
		}
		return c.errf(path+".type", "is %s; a tool's input is a JSON object, so its schema says \"type\": \"object\"", got)
	}
	return nil
}

// absent reports whether a raw JSON value is missing: empty, or null.
func absent(raw json.RawMessage) bool {
	t := trimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// isObject reports whether raw is one valid JSON object.
func isObject(raw []byte) bool {
	t := trimSpace(raw)
	return len(t) > 0 && t[0] == '{' && json.Valid(t)
}

// jsonKind names the JSON type of raw, for error messages.
func jsonKind(raw []byte) string {
	t := trimSpace(raw)
	if len(t) == 0 {
		return "nothing"
	}
	if !json.Valid(t) {
		return "invalid JSON"
	}
	switch t[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

func trimSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }
