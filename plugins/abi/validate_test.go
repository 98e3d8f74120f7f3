package abi

import (
	"encoding/json"
	"errors"
	"testing"
)

func calculator() Tool {
	return Tool{
		Name:        "calculate",
		Description: "Evaluate an arithmetic expression",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}`),
		Idempotent:  true,
		Approval:    ApprovalNever,
	}
}

func toolExecutor() Describe {
	return Describe{ABI: 1, Name: "calculator", Version: "0.1.0", Role: RoleExecutor,
		Effects: []EffectKind{KindTool}, Tools: []Tool{calculator()}, Attach: true}
}

func TestValidateDescribe(t *testing.T) {
	with := func(f func(*Describe)) Describe {
		d := toolExecutor()
		d.Tools = append([]Tool(nil), d.Tools...)
		f(&d)
		return d
	}
	withTool := func(f func(*Tool)) Describe {
		return with(func(d *Describe) { f(&d.Tools[0]) })
	}
	builder := Describe{ABI: 1, Name: "chat-builder", Role: RoleBuilder}
	model := Describe{ABI: 1, Name: "openai", Role: RoleExecutor, Effects: []EffectKind{KindModel}}
	cases := []struct {
		name     string
		d        Describe
		wantRole Role
		want     string
		sentinel error
	}{
		{"the draft's calculator is valid", toolExecutor(), RoleExecutor, ok, nil},
		{"any role is accepted when none is wanted", builder, "", ok, nil},
		{"a builder with nothing else is valid", builder, RoleBuilder, ok, nil},
		{"a model executor offers no tools", model, RoleExecutor, ok, nil},
		{"an executor may carry out both kinds", with(func(d *Describe) { d.Effects = []EffectKind{KindModel, KindTool} }), RoleExecutor, ok, nil},
		{"a tool without schema, approval or description is valid", withTool(func(tl *Tool) { *tl = Tool{Name: "now"} }), RoleExecutor, ok, nil},
		{"a null input schema counts as none", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`null`) }), RoleExecutor, ok, nil},
		{"approval always is valid", withTool(func(tl *Tool) { tl.Approval = ApprovalAlways }), RoleExecutor, ok, nil},

		{"abi 0 (missing) is refused as a version mismatch", with(func(d *Describe) { d.ABI = 0 }), "", "abi", ErrUnsupportedVersion},
		{"abi 2 is refused as a version mismatch", with(func(d *Describe) { d.ABI = 2 }), "", "abi", ErrUnsupportedVersion},
		{"a blank name is refused", with(func(d *Describe) { d.Name = "  " }), "", "name", nil},
		{"a missing role is refused", with(func(d *Describe) { d.Role = "" }), "", "role", nil},
		{"an unknown role is refused", with(func(d *Describe) { d.Role = "planner" }), "", "role", nil},
		{"a builder loaded as an executor is a role mismatch", builder, RoleExecutor, "role", ErrRoleMismatch},
		{"an executor loaded as a builder is a role mismatch", toolExecutor(), RoleBuilder, "role", ErrRoleMismatch},
		{"a builder with effects is refused", Describe{ABI: 1, Name: "b", Role: RoleBuilder, Effects: []EffectKind{KindModel}}, "", "effects", nil},
		{"a builder with tools is refused", Describe{ABI: 1, Name: "b", Role: RoleBuilder, Tools: []Tool{calculator()}}, "", "tools", nil},
		{"an executor without effects is refused", with(func(d *Describe) { d.Effects = nil }), "", "effects", nil},
		{"an unknown effect kind is refused", with(func(d *Describe) { d.Effects = []EffectKind{KindTool, "search"} }), "", "effects[1]", nil},
		{"an effect kind listed twice is refused", with(func(d *Describe) { d.Effects = []EffectKind{KindTool, KindTool} }), "", "effects[1]", nil},
		{"a tool executor without tools is refused", with(func(d *Describe) { d.Tools = nil }), "", "tools", nil},
		{"a model executor with tools is refused", with(func(d *Describe) { d.Effects = []EffectKind{KindModel} }), "", "tools", nil},
		{"an empty tool name is refused", withTool(func(tl *Tool) { tl.Name = "" }), "", "tools[0].name", nil},
		{"a tool name with a space is refused", withTool(func(tl *Tool) { tl.Name = "do it" }), "", "tools[0].name", nil},
		{"a tool name with a dot is refused", withTool(func(tl *Tool) { tl.Name = "calc.add" }), "", "tools[0].name", nil},
		{"a tool name of 65 characters is refused", withTool(func(tl *Tool) { tl.Name = string(make65()) }), "", "tools[0].name", nil},
		{"a tool offered twice is refused", with(func(d *Describe) { d.Tools = append(d.Tools, calculator()) }), "", "tools[1].name", nil},
		{"an unknown approval mode is refused", withTool(func(tl *Tool) { tl.Approval = "sometimes" }), "", "tools[0].approval", nil},
		{"a schema that is an array is refused", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`[]`) }), "", "tools[0].input_schema", nil},
		{"a schema that is a string is refused", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`"object"`) }), "", "tools[0].input_schema", nil},
		{"a schema that is not JSON is refused", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`{"type":`) }), "", "tools[0].input_schema", nil},
		{"a schema without a type is refused", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`{"properties":{}}`) }), "", "tools[0].input_schema.type", nil},
		{"a schema for a string is refused", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`{"type":"string"}`) }), "", "tools[0].input_schema.type", nil},
		{"a schema whose type is a list is refused", withTool(func(tl *Tool) { tl.InputSchema = json.RawMessage(`{"type":["object","null"]}`) }), "", "tools[0].input_schema.type", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateDescribe(tc.d, tc.wantRole)
			checkVerdict(t, err, tc.want)
			if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
				t.Fatalf("error %q does not wrap %v", err, tc.sentinel)
			}
			if tc.sentinel == nil && (errors.Is(err, ErrUnsupportedVersion) || errors.Is(err, ErrRoleMismatch)) {
				t.Fatalf("error %q wraps a sentinel it should not", err)
			}
		})
	}
}

func make65() []byte {
	b := make([]byte, MaxToolNameLen+1)
	for i := range b {
		b[i] = 'a'
	}
	return b
}

func TestValidToolNameAcceptsExactlyTheGrammar(t *testing.T) {
	for _, name := range []string{"a", "calculate", "get_weather", "web-search", "Tool9", string(make65()[:64])} {
		if !ValidToolName(name) {
			t.Errorf("ValidToolName(%q) = false, want true", name)
		}
	}
	for _, name := range []string{"", " ", "a b", "a.b", "a/b", "é", "a\x00", string(make65())} {
		if ValidToolName(name) {
			t.Errorf("ValidToolName(%q) = true, want false", name)
		}
	}
}

// effectReplyCases are shared by the Validate and Decode tests and seed the
// fuzz corpus.
var effectReplyCases = []struct {
	name   string
	kind   EffectKind
	export string
	json   string
	want   string
}{
	{"a tool result is done", KindTool, ExportStart, `{"state":"done","outcome":{"content":"5","is_error":false}}`, ok},
	{"a tool error result is done", KindTool, ExportPoll, `{"state":"done","outcome":{"content":"division by zero","is_error":true}}`, ok},
	{"an empty tool outcome object is done with empty content", KindTool, ExportStart, `{"state":"done","outcome":{}}`, ok},
	{"a final answer is done", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"role":"assistant","content":"5 and 20"},"usage":{"input_tokens":12,"output_tokens":3}}}`, ok},
	{"an empty message role reads as assistant", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"content":"hi"}}}`, ok},
	{"tool calls with and without ids are done", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"role":"assistant","tool_calls":[{"id":"call_1","name":"calculate","arguments":{"expression":"2+3"}},{"name":"now"}]}}}`, ok},
	{"null arguments count as none", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"tool_calls":[{"name":"now","arguments":null}]}}}`, ok},
	{"await_input is done", KindModel, ExportPoll, `{"state":"done","outcome":{"message":{"role":"assistant","content":"Which city?"},"await_input":{"prompt":"Which city?"}}}`, ok},
	{"an unknown field is ignored", KindTool, ExportStart, `{"state":"done","outcome":{"content":"5","extra":[1,2]},"trace_id":"x"}`, ok},
	{"an error on a done reply is ignored", KindTool, ExportStart, `{"state":"done","outcome":{"content":"5"},"error":{"message":""}}`, ok},
	{"pending with a handle and interval", KindTool, ExportStart, `{"state":"pending","handle":"job-42","poll_after_ms":500}`, ok},
	{"pending without a handle", KindModel, ExportPoll, `{"state":"pending"}`, ok},
	{"attach may answer pending", KindTool, ExportAttach, `{"state":"pending","handle":"job-42"}`, ok},
	{"failed with a message", KindTool, ExportStart, `{"state":"failed","error":{"message":"quota exhausted","retriable":true}}`, ok},
	{"an outcome on a failed reply is ignored", KindTool, ExportStart, `{"state":"failed","outcome":7,"error":{"message":"no"}}`, ok},
	{"poll may answer unknown", KindTool, ExportPoll, `{"state":"unknown"}`, ok},
	{"attach may answer unknown", KindModel, ExportAttach, `{"state":"unknown"}`, ok},
	{"JSON may be formatted any way", KindTool, ExportStart, " \n{ \"state\" : \"done\",\n \"outcome\" : { \"content\" : \"5\" } }\n", ok},

	{"start may not answer unknown", KindTool, ExportStart, `{"state":"unknown"}`, "state"},
	{"cancelled is not an effect reply state", KindTool, ExportPoll, `{"state":"cancelled"}`, "state"},
	{"a missing state is refused", KindTool, ExportStart, `{"outcome":{"content":"5"}}`, "state"},
	{"an unknown state is refused", KindTool, ExportStart, `{"state":"running"}`, "state"},
	{"state is case-sensitive", KindTool, ExportStart, `{"state":"DONE","outcome":{"content":"5"}}`, "state"},
	{"a state that is a number is refused", KindTool, ExportStart, `{"state":1}`, "state"},
	{"done without an outcome is refused", KindTool, ExportStart, `{"state":"done"}`, "outcome"},
	{"done with a null outcome is refused", KindModel, ExportStart, `{"state":"done","outcome":null}`, "outcome"},
	{"a tool outcome that is a string is refused", KindTool, ExportStart, `{"state":"done","outcome":"5"}`, "outcome"},
	{"a tool outcome with numeric content is refused", KindTool, ExportStart, `{"state":"done","outcome":{"content":5}}`, "outcome.content"},
	{"a model outcome that is an array is refused", KindModel, ExportStart, `{"state":"done","outcome":[]}`, "outcome"},
	{"a model message from the user is refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"role":"user","content":"hi"}}}`, "outcome.message.role"},
	{"a tool call without a name is refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"tool_calls":[{"id":"a","name":"calculate"},{"id":"b","name":""}]}}}`, "outcome.message.tool_calls[1].name"},
	{"a tool call id used twice is refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"tool_calls":[{"id":"a","name":"x"},{"id":"a","name":"y"}]}}}`, "outcome.message.tool_calls[1].id"},
	{"tool arguments that are a string are refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"tool_calls":[{"name":"calculate","arguments":"{\"expression\":\"2+3\"}"}]}}}`, "outcome.message.tool_calls[0].arguments"},
	{"tool arguments that are an array are refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"tool_calls":[{"name":"calculate","arguments":[1]}]}}}`, "outcome.message.tool_calls[0].arguments"},
	{"tool calls that are an object are refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"tool_calls":{"name":"x"}}}}`, "outcome.message.tool_calls"},
	{"negative input tokens are refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"content":"x"},"usage":{"input_tokens":-1}}}`, "outcome.usage.input_tokens"},
	{"negative output tokens are refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"content":"x"},"usage":{"output_tokens":-1}}}`, "outcome.usage.output_tokens"},
	{"fractional tokens are refused", KindModel, ExportStart, `{"state":"done","outcome":{"message":{"content":"x"},"usage":{"input_tokens":1.5}}}`, "outcome.usage.input_tokens"},
	{"failed without an error is refused", KindTool, ExportStart, `{"state":"failed"}`, "error"},
	{"failed with a null error is refused", KindTool, ExportStart, `{"state":"failed","error":null}`, "error"},
	{"failed with a blank message is refused", KindTool, ExportStart, `{"state":"failed","error":{"message":" ","retriable":true}}`, "error.message"},
	{"an error that is a string is refused", KindTool, ExportStart, `{"state":"failed","error":"boom"}`, "error"},
	{"a retriable flag that is a string is refused", KindTool, ExportStart, `{"state":"failed","error":{"message":"x","retriable":"yes"}}`, "error.retriable"},
	{"a negative poll interval is refused", KindTool, ExportStart, `{"state":"pending","handle":"h","poll_after_ms":-1}`, "poll_after_ms"},
	{"a negative poll interval is refused even when done", KindTool, ExportStart, `{"state":"done","outcome":{"content":"5"},"poll_after_ms":-5}`, "poll_after_ms"},
	{"a handle that is a number is refused", KindTool, ExportStart, `{"state":"pending","handle":42}`, "handle"},
	{"an empty reply is refused", KindTool, ExportStart, ``, "(reply)"},
	{"a blank reply is refused", KindTool, ExportStart, " \n", "(reply)"},
	{"null is refused", KindTool, ExportStart, `null`, "(reply)"},
	{"an array is refused", KindTool, ExportStart, `[{"state":"done"}]`, "(reply)"},
	{"a bare string is refused", KindTool, ExportStart, `"done"`, "(reply)"},
	{"malformed JSON is refused", KindTool, ExportStart, `{"state":"done",`, "(reply)"},
	{"trailing data is refused", KindTool, ExportStart, `{"state":"pending"} {"state":"done"}`, "(reply)"},
	{"not JSON at all is refused", KindTool, ExportStart, `state=done`, "(reply)"},
}

func TestDecodeEffectReply(t *testing.T) {
	for _, tc := range effectReplyCases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeEffectReply([]byte(tc.json), tc.kind, tc.export)
			checkVerdict(t, err, tc.want)
			if tc.want != ok {
				if r.State != "" || r.Outcome != nil || r.Error != nil {
					t.Fatalf("a refused reply came back non-zero: %+v", r)
				}
				return
			}
			// What Decode accepts, Validate accepts.
			if err := ValidateEffectReply(r, tc.kind, tc.export); err != nil {
				t.Fatalf("ValidateEffectReply refuses what DecodeEffectReply accepted: %v", err)
			}
		})
	}
}

func TestValidateEffectReplyOfGoValues(t *testing.T) {
	cases := []struct {
		name   string
		r      EffectReply
		kind   EffectKind
		export string
		want   string
	}{
		{"a done reply built in Go", EffectReply{State: StateDone, Outcome: json.RawMessage(`{"content":"5"}`)}, KindTool, ExportStart, ok},
		{"an outcome of invalid bytes is refused", EffectReply{State: StateDone, Outcome: json.RawMessage(`{"content":`)}, KindTool, ExportStart, "outcome"},
		{"tool arguments of invalid bytes are refused", EffectReply{State: StateDone, Outcome: json.RawMessage(`{"message":{"tool_calls":[{"name":"x","arguments":{"a":}}]}}`)}, KindModel, ExportStart, "outcome"},
		{"a model outcome given for a tool effect is a tool outcome with empty content", EffectReply{State: StateDone, Outcome: json.RawMessage(`{"message":{"content":"x"}}`)}, KindTool, ExportStart, ok},
		{"a tool outcome given for a model effect is an empty final answer", EffectReply{State: StateDone, Outcome: json.RawMessage(`{"content":"5"}`)}, KindModel, ExportStart, ok},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, ValidateEffectReply(tc.r, tc.kind, tc.export), tc.want)
		})
	}
}

func TestCallerMistakesAreInvalidArgumentsNotInvalidReplies(t *testing.T) {
	done := []byte(`{"state":"done","outcome":{"content":"5"}}`)
	_, decodeCancelKind := DecodeCancelReply([]byte(`{"state":"cancelled"}`), "")
	_, decodeBadExport := DecodeEffectReply(done, KindTool, "build")
	_, decodeBadKind := DecodeEffectReply([]byte(`not json`), "search", ExportStart)
	_, decodeBadRole := DecodeDescribe([]byte(`not json`), "planner")
	errs := map[string]error{
		"ValidateEffectReply with export cancel":   ValidateEffectReply(EffectReply{State: StateDone}, KindTool, ExportCancel),
		"ValidateEffectReply with an empty kind":   ValidateEffectReply(EffectReply{State: StatePending}, "", ExportStart),
		"ValidateCancelReply with an unknown kind": ValidateCancelReply(CancelReply{State: StateCancelled}, "search"),
		"ValidateDescribe with an unknown role":    ValidateDescribe(toolExecutor(), "planner"),
		"DecodeCancelReply with an empty kind":     decodeCancelKind,
		"DecodeEffectReply with export build":      decodeBadExport,
		"DecodeDescribe with an unknown role":      decodeBadRole,
		"DecodeEffectReply with an unknown kind":   decodeBadKind,
	}
	for name, err := range errs {
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", name, err)
		}
		if errors.Is(err, ErrInvalidReply) {
			t.Errorf("%s: %v blames the plugin", name, err)
		}
		if err != nil && err.Error()[:5] != "abi: " {
			t.Errorf("%s: message %q does not start with \"abi: \"", name, err)
		}
	}
}

func TestDecodeCancelReply(t *testing.T) {
	cases := []struct {
		name string
		kind EffectKind
		json string
		want string
	}{
		{"cancelled settles as cancelled", KindTool, `{"state":"cancelled"}`, ok},
		{"unknown settles as cancelled", KindModel, `{"state":"unknown"}`, ok},
		{"done with a tool outcome", KindTool, `{"state":"done","outcome":{"content":"5"}}`, ok},
		{"done with a model outcome", KindModel, `{"state":"done","outcome":{"message":{"role":"assistant","content":"late answer"}}}`, ok},
		{"an outcome on cancelled is ignored", KindTool, `{"state":"cancelled","outcome":{"content":5}}`, ok},
		{"done without an outcome is refused", KindTool, `{"state":"done"}`, "outcome"},
		{"done with a bad model outcome is refused", KindModel, `{"state":"done","outcome":{"message":{"role":"tool"}}}`, "outcome.message.role"},
		{"pending is not a cancel state", KindTool, `{"state":"pending","handle":"h"}`, "state"},
		{"failed is not a cancel state", KindTool, `{"state":"failed","error":{"message":"x"}}`, "state"},
		{"a missing state is refused", KindTool, `{}`, "state"},
		{"malformed JSON is refused", KindTool, `{"state":`, "(reply)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeCancelReply([]byte(tc.json), tc.kind)
			checkVerdict(t, err, tc.want)
			if err == nil {
				checkVerdict(t, ValidateCancelReply(r, tc.kind), ok)
			}
		})
	}
}

func TestValidateBuildOutput(t *testing.T) {
	msgs := func(m ...Message) BuildOutput { return BuildOutput{Request: ModelRequest{Messages: m}} }
	sys := Message{Role: MessageSystem, Content: "You are terse."}
	user := Message{Role: MessageUser, Content: "What is 2+3?"}
	asked := Message{Role: MessageAssistant, ToolCalls: []ToolCall{{ID: "call_1", Name: "calculate", Arguments: json.RawMessage(`{"expression":"2+3"}`)}}}
	answer := Message{Role: MessageTool, Content: "5", ToolCallID: "call_1"}
	withTools := func(tools ...Tool) BuildOutput {
		o := msgs(sys, user)
		o.Request.Tools = tools
		return o
	}
	cases := []struct {
		name string
		o    BuildOutput
		want string
	}{
		{"a system and a user message", msgs(sys, user), ok},
		{"a transcript with a tool round trip", msgs(sys, user, asked, answer), ok},
		{"tools and params are passed on", BuildOutput{Request: ModelRequest{Messages: []Message{user}, Tools: []Tool{calculator()}, Params: map[string]any{"temperature": 0}}}, ok},
		{"no messages is refused", msgs(), "request.messages"},
		{"a message without a role is refused", msgs(sys, Message{Content: "hi"}), "request.messages[1].role"},
		{"an unknown role is refused", msgs(Message{Role: "developer", Content: "x"}), "request.messages[0].role"},
		{"tool calls on a user message are refused", msgs(Message{Role: MessageUser, ToolCalls: asked.ToolCalls}), "request.messages[0].tool_calls"},
		{"a tool message without its call id is refused", msgs(user, asked, Message{Role: MessageTool, Content: "5"}), "request.messages[2].tool_call_id"},
		{"a tool call without a name is refused", msgs(user, Message{Role: MessageAssistant, ToolCalls: []ToolCall{{ID: "c"}}}), "request.messages[1].tool_calls[0].name"},
		{"tool arguments that are a number are refused", msgs(user, Message{Role: MessageAssistant, ToolCalls: []ToolCall{{Name: "x", Arguments: json.RawMessage(`3`)}}}), "request.messages[1].tool_calls[0].arguments"},
		{"a bad tool name is refused", withTools(Tool{Name: "no spaces please"}), "request.tools[0].name"},
		{"a tool passed twice is refused", withTools(calculator(), calculator()), "request.tools[1].name"},
		{"a bad tool schema is refused", withTools(Tool{Name: "x", InputSchema: json.RawMessage(`{"type":"array"}`)}), "request.tools[0].input_schema.type"},
		{"a bad approval is refused", withTools(Tool{Name: "x", Approval: "maybe"}), "request.tools[0].approval"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, ValidateBuildOutput(tc.o), tc.want)
			raw, err := json.Marshal(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			_, err = DecodeBuildOutput(raw)
			checkVerdict(t, err, tc.want)
		})
	}
}

func TestDecodeBuildOutputNamesMistypedFields(t *testing.T) {
	cases := []struct {
		name, json, want string
	}{
		{"the draft's shape decodes", `{"request":{"messages":[{"role":"user","content":"hi"}],"tools":[],"params":{}}}`, ok},
		{"messages that are an object are refused", `{"request":{"messages":{"role":"user"}}}`, "request.messages"},
		{"content that is a number is refused", `{"request":{"messages":[{"role":"user","content":1}]}}`, "request.messages.content"},
		{"a request that is missing is refused for its messages", `{}`, "request.messages"},
		{"params that are an array are refused", `{"request":{"messages":[{"role":"user"}],"params":[]}}`, "request.params"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeBuildOutput([]byte(tc.json))
			checkVerdict(t, err, tc.want)
		})
	}
}

func TestDecodeDescribe(t *testing.T) {
	draft := `{
  "abi": 1,
  "name": "calculator",
  "version": "0.1.0",
  "role": "executor",
  "effects": ["tool"],
  "tools": [
    {
      "name": "calculate",
      "description": "Evaluate an arithmetic expression",
      "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
      "idempotent": true,
      "approval": "never"
    }
  ],
  "attach": true
}`
	d, err := DecodeDescribe([]byte(draft), RoleExecutor)
	checkVerdict(t, err, ok)
	if d.Name != "calculator" || !d.Attach || len(d.Tools) != 1 || !d.Tools[0].Idempotent || d.Tools[0].Approval != ApprovalNever {
		t.Fatalf("decoded %+v", d)
	}
	cases := []struct{ name, json, want string }{
		{"abi as a string is refused", `{"abi":"1","name":"x","role":"builder"}`, "abi"},
		{"effects as a string is refused", `{"abi":1,"name":"x","role":"executor","effects":"tool"}`, "effects"},
		{"attach as a string is refused", `{"abi":1,"name":"x","role":"builder","attach":"yes"}`, "attach"},
		{"a missing abi is a version mismatch", `{"name":"x","role":"builder"}`, "abi"},
		{"an empty reply is refused", ``, "(reply)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeDescribe([]byte(tc.json), "")
			checkVerdict(t, err, tc.want)
		})
	}
}

func TestDecodeOutcomes(t *testing.T) {
	m, err := DecodeModelOutcome(json.RawMessage(`{"message":{"role":"assistant","content":"","tool_calls":[{"id":"call_1","name":"calculate","arguments":{"expression":"2+3"}}]},"usage":{"input_tokens":20,"output_tokens":9}}`))
	checkVerdict(t, err, ok)
	if len(m.Message.ToolCalls) != 1 || m.Message.ToolCalls[0].Name != "calculate" || m.Usage.InputTokens != 20 {
		t.Fatalf("decoded %+v", m)
	}
	to, err := DecodeToolOutcome(json.RawMessage(`{"content":"5","is_error":true}`))
	checkVerdict(t, err, ok)
	if to != (ToolOutcome{Content: "5", IsError: true}) {
		t.Fatalf("decoded %+v", to)
	}

	cases := []struct {
		name   string
		decode func(json.RawMessage) error
		raw    string
		want   string
	}{
		{"a missing model outcome is refused", decodeModel, ``, "(reply)"},
		{"a null model outcome is refused", decodeModel, `null`, "(reply)"},
		{"a model outcome from the system is refused", decodeModel, `{"message":{"role":"system"}}`, "message.role"},
		{"a model outcome with a nameless call is refused", decodeModel, `{"message":{"tool_calls":[{"id":"x"}]}}`, "message.tool_calls[0].name"},
		{"a prompt that is a number is refused", decodeModel, `{"message":{},"await_input":{"prompt":1}}`, "await_input.prompt"},
		{"a missing tool outcome is refused", decodeTool, ``, "(reply)"},
		{"a tool outcome that is a number is refused", decodeTool, `5`, "(reply)"},
		{"is_error that is a string is refused", decodeTool, `{"content":"x","is_error":"no"}`, "is_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			checkVerdict(t, tc.decode(json.RawMessage(tc.raw)), tc.want)
		})
	}
}

func decodeModel(raw json.RawMessage) error { _, err := DecodeModelOutcome(raw); return err }
func decodeTool(raw json.RawMessage) error  { _, err := DecodeToolOutcome(raw); return err }

func TestFieldErrorSaysWhichReplyAndField(t *testing.T) {
	_, err := DecodeEffectReply([]byte(`{"state":"done","outcome":{"message":{"tool_calls":[{"name":""}]}}}`), KindModel, ExportPoll)
	want := `abi: poll reply: outcome.message.tool_calls[0].name: is empty; name the tool to call`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	_, err = DecodeEffectReply([]byte(`{"state":"done","outcome":{"content":5}}`), KindTool, ExportStart)
	var syntax *json.UnmarshalTypeError
	if !errors.As(err, &syntax) {
		t.Fatalf("error %v does not carry the JSON type error as its cause", err)
	}
	if want := `abi: start reply: outcome.content: is a JSON number; want a string`; err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}
