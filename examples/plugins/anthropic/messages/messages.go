// Package messages maps agenthost's model requests to Anthropic Messages
// API requests (POST {base_url}/v1/messages) and their responses back to
// model outcomes, whole or streamed (stream.go). It is plain Go, so its
// tests run on the host; the plugin (package main, built for wasip1) reads
// the config and calls Call with the host's functions.
package messages

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/plugins/abi"
)

// KeyStructuredOutputs is this plugin's own config key, beside the ones
// every example model executor reads (package modelcall), in lower case:
// the operator's YAML loader (viper) lowercases every key.
const KeyStructuredOutputs = "structured_outputs"

// DefaultBaseURL is where the plugin sends requests when base_url is not
// set: Anthropic's API.
const DefaultBaseURL = "https://api.anthropic.com"

// DefaultMaxTokens is max_tokens when neither the request's params nor the
// config set it: the API requires one on every request.
const DefaultMaxTokens = 4096

// APIVersion is the anthropic-version header every request carries.
const APIVersion = "2023-06-01"

// Config is the plugin's configuration: the shared keys (BaseURL such as
// https://api.anthropic.com, to which the plugin appends /v1/messages;
// Model such as claude-sonnet-4-5; APIKey, sent as "x-api-key" when set;
// MaxTokens, DefaultMaxTokens unless set), and its own.
type Config struct {
	modelcall.Config
	// StructuredOutputs sends the agent's output schema as output_config;
	// off by default, since only recent models take it.
	StructuredOutputs bool
}

// configSpec is how this plugin reads the shared keys: base_url defaults
// to Anthropic's API.
var configSpec = modelcall.ConfigSpec{
	Plugin:         "anthropic",
	DefaultBaseURL: DefaultBaseURL,
	ModelExample:   "claude-sonnet-4-5",
}

// ParseConfig reads the config through get (the plugin passes Extism's
// config_get). model is required; base_url defaults to DefaultBaseURL
// and max_tokens to DefaultMaxTokens; stream is true unless set to false;
// a value of the wrong type is an error that names the key.
func ParseConfig(get func(string) (string, bool)) (Config, error) {
	shared, problems := modelcall.ParseConfig(get, configSpec)
	c := Config{Config: shared}
	if c.MaxTokens == 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if strings.HasPrefix(c.BaseURL, "http") && strings.HasSuffix(c.BaseURL, "/v1") {
		problems = append(problems, fmt.Sprintf("base_url %q ends with /v1, and the plugin appends /v1/messages: drop the /v1 (%s)", c.BaseURL, DefaultBaseURL))
	}
	if s, _ := get(KeyStructuredOutputs); strings.TrimSpace(s) != "" {
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			problems = append(problems, fmt.Sprintf("structured_outputs %q is not true or false", strings.TrimSpace(s)))
		} else {
			c.StructuredOutputs = b
		}
	}
	if err := modelcall.Err(configSpec.Plugin, problems); err != nil {
		return Config{}, err
	}
	return c, nil
}

// The wire shapes of the Messages API, as far as this plugin uses them.
type (
	// Request is the body of POST {base_url}/v1/messages.
	Request struct {
		Model         string         `json:"model"`
		MaxTokens     int            `json:"max_tokens"`
		System        string         `json:"system,omitempty"`
		Messages      []Message      `json:"messages"`
		Tools         []Tool         `json:"tools,omitempty"`
		ToolChoice    map[string]any `json:"tool_choice,omitempty"`
		Temperature   *float64       `json:"temperature,omitempty"`
		StopSequences []string       `json:"stop_sequences,omitempty"`
		// OutputConfig asks for an answer that matches a JSON Schema: the
		// agent's output schema, when the config turns structured outputs
		// on.
		OutputConfig *OutputConfig `json:"output_config,omitempty"`
		// Stream asks for the answer as a stream of events.
		Stream bool `json:"stream,omitempty"`
	}
	// OutputConfig is {"format": {"type": "json_schema", "schema": …}}.
	OutputConfig struct {
		Format OutputFormat `json:"format"`
	}
	OutputFormat struct {
		Type   string         `json:"type"`
		Schema map[string]any `json:"schema"`
	}
	// Message is one turn: roles alternate user, assistant, user …
	Message struct {
		Role    string  `json:"role"`
		Content []Block `json:"content"`
	}
	// Block is a content block of a request: text, tool_use (an assistant
	// turn's call) or tool_result (a user turn's answer to one).
	Block struct {
		Type      string          `json:"type"`
		Text      string          `json:"text,omitempty"`
		ID        string          `json:"id,omitempty"`
		Name      string          `json:"name,omitempty"`
		Input     json.RawMessage `json:"input,omitempty"`
		ToolUseID string          `json:"tool_use_id,omitempty"`
		Content   string          `json:"content,omitempty"`
		IsError   bool            `json:"is_error,omitempty"`
	}
	// Tool is a client tool.
	Tool struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	// Response is the body of a successful response.
	Response struct {
		Type       string          `json:"type"`
		Role       string          `json:"role"`
		Content    []ResponseBlock `json:"content"`
		StopReason string          `json:"stop_reason"`
		Usage      Usage           `json:"usage"`
	}
	// Usage is the tokens the server counted.
	Usage struct {
		InputTokens              int64 `json:"input_tokens"`
		OutputTokens             int64 `json:"output_tokens"`
		CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	}
	// ResponseBlock is a content block of a response; blocks of other
	// types (thinking, server tools) are skipped.
	ResponseBlock struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	// ErrorBody is the body of an error response:
	// {"type": "error", "error": {"type": …, "message": …}, "request_id": …}.
	ErrorBody struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
)

// Block types and roles of the Messages API.
const (
	blockText       = "text"
	blockToolUse    = "tool_use"
	blockToolResult = "tool_result"
	roleUser        = "user"
	roleAssistant   = "assistant"
)

// The params Encode reads besides abi's (model, temperature,
// max_output_tokens, output_schema).
const (
	// ParamMaxTokens is max_output_tokens under its Anthropic name.
	ParamMaxTokens = "max_tokens"
	// ParamStop and ParamStopSequences are stop sequences: a string or a
	// list of strings.
	ParamStop          = "stop"
	ParamStopSequences = "stop_sequences"
	// ParamToolChoice is "auto", "any" (or "required"), "none", a tool's
	// name, or an object sent as it is.
	ParamToolChoice = "tool_choice"
)

// emptySchema is what a tool with no input schema takes: no arguments.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Encode makes the Messages API request body for a model request, which
// asks for a stream of events when the config's Stream is on.
//
// System messages become the top-level system prompt, joined by a blank
// line. The others become turns that alternate user and assistant:
// consecutive messages of one side merge into one turn, an assistant's
// tool calls become tool_use blocks, and tool messages become tool_result
// blocks of a user turn, first in it, as the API requires. The API
// refuses a conversation that does not pair every tool_use with a
// tool_result in the next turn, so Encode leaves out what cannot be
// paired (the calls of a Run cancelled before their results, results
// whose call a history window cut off), and assistant turns before the
// first user turn. Tool call IDs keep only the characters the API allows
// (letters, digits, _ and -); any other becomes _.
//
// The request's params (most often the Run's agent's settings) override
// the config: "model" (string), "temperature" (number), and
// "max_output_tokens" or "max_tokens" (integer, sent as max_tokens). It
// also reads "stop" or "stop_sequences" (a string or a list of strings,
// sent as stop_sequences), "tool_choice" (see ParamToolChoice; sent only
// with tools), and, when the config turns structured outputs on,
// "output_schema" (an object, sent as output_config). Other params are
// not sent: they may be meant for another executor.
func Encode(c Config, req abi.ModelRequest) ([]byte, error) {
	out := Request{Model: c.Model, MaxTokens: c.MaxTokens, Temperature: c.Temperature, Stream: c.Stream}
	if out.MaxTokens <= 0 {
		out.MaxTokens = DefaultMaxTokens
	}
	p := req.Params
	if v, ok := p[abi.ParamModel].(string); ok && strings.TrimSpace(v) != "" {
		out.Model = strings.TrimSpace(v)
	}
	if v, ok := p[abi.ParamTemperature].(float64); ok {
		out.Temperature = &v
	}
	for _, key := range []string{ParamMaxTokens, abi.ParamMaxOutputTokens} {
		if v, ok := p[key].(float64); ok && v >= 1 {
			out.MaxTokens = int(v)
		}
	}
	out.StopSequences = append(stopSequences(p[ParamStop]), stopSequences(p[ParamStopSequences])...)
	if s, ok := p[abi.ParamOutputSchema].(map[string]any); ok && c.StructuredOutputs {
		out.OutputConfig = &OutputConfig{Format: OutputFormat{Type: "json_schema", Schema: s}}
	}
	var system []string
	for i, m := range req.Messages {
		switch m.Role {
		case abi.MessageSystem:
			if strings.TrimSpace(m.Content) != "" {
				system = append(system, m.Content)
			}
		case abi.MessageUser:
			out.Messages = appendTurn(out.Messages, roleUser, textBlocks(m.Content))
		case abi.MessageTool:
			out.Messages = appendTurn(out.Messages, roleUser, []Block{{Type: blockToolResult, ToolUseID: toolID(m.ToolCallID), Content: m.Content, IsError: m.IsError}})
		case abi.MessageAssistant:
			blocks := textBlocks(m.Content)
			for _, tc := range m.ToolCalls {
				input := tc.Arguments
				if len(input) == 0 || string(input) == "null" {
					input = json.RawMessage(`{}`)
				}
				blocks = append(blocks, Block{Type: blockToolUse, ID: toolID(tc.ID), Name: tc.Name, Input: input})
			}
			out.Messages = appendTurn(out.Messages, roleAssistant, blocks)
		default:
			return nil, fmt.Errorf("message %d has role %q, which is not system, user, assistant or tool", i, m.Role)
		}
	}
	out.System = strings.Join(system, "\n\n")
	out.Messages = pairToolBlocks(out.Messages)
	if len(out.Messages) == 0 {
		return nil, fmt.Errorf("the request has no user message to answer (%d messages, none of them a user's text or a tool result)", len(req.Messages))
	}
	for _, t := range req.Tools {
		schema := t.InputSchema
		if len(schema) == 0 || string(schema) == "null" {
			schema = emptySchema
		}
		out.Tools = append(out.Tools, Tool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	if len(out.Tools) > 0 {
		out.ToolChoice = toolChoice(p[ParamToolChoice])
	}
	return json.Marshal(out)
}

// textBlocks is a text block of s, or none for blank s: the API refuses
// an empty text block.
func textBlocks(s string) []Block {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	return []Block{{Type: blockText, Text: s}}
}

// appendTurn adds blocks to the conversation: to its last turn when that
// turn is role's, else as a new turn. No blocks add nothing.
func appendTurn(turns []Message, role string, blocks []Block) []Message {
	if len(blocks) == 0 {
		return turns
	}
	if n := len(turns); n > 0 && turns[n-1].Role == role {
		turns[n-1].Content = append(turns[n-1].Content, blocks...)
		return turns
	}
	return append(turns, Message{Role: role, Content: blocks})
}

// pairToolBlocks makes the conversation one the API takes: it starts with
// a user turn; every tool_result answers a tool_use of the turn just
// before it and comes before any text of its turn; every tool_use has its
// tool_result in the turn just after it. Blocks that break this are left
// out, then turns left empty, and the turns around them merge; it repeats
// until nothing changes.
func pairToolBlocks(turns []Message) []Message {
	for {
		changed := false
		for len(turns) > 0 && turns[0].Role != roleUser {
			turns, changed = turns[1:], true
		}
		// Results with no call in the turn before.
		for i := range turns {
			if turns[i].Role != roleUser {
				continue
			}
			calls := map[string]bool{}
			if i > 0 {
				for _, b := range turns[i-1].Content {
					if b.Type == blockToolUse {
						calls[b.ID] = true
					}
				}
			}
			kept := slices.DeleteFunc(turns[i].Content, func(b Block) bool { return b.Type == blockToolResult && !calls[b.ToolUseID] })
			changed = changed || len(kept) != len(turns[i].Content)
			turns[i].Content = kept
		}
		// Calls with no result in the turn after.
		for i := range turns {
			if turns[i].Role != roleAssistant {
				continue
			}
			results := map[string]bool{}
			if i+1 < len(turns) {
				for _, b := range turns[i+1].Content {
					if b.Type == blockToolResult {
						results[b.ToolUseID] = true
					}
				}
			}
			kept := slices.DeleteFunc(turns[i].Content, func(b Block) bool { return b.Type == blockToolUse && !results[b.ID] })
			changed = changed || len(kept) != len(turns[i].Content)
			turns[i].Content = kept
		}
		var merged []Message
		for _, t := range turns {
			if len(t.Content) == 0 {
				changed = true
				continue
			}
			if n := len(merged); n > 0 && merged[n-1].Role == t.Role {
				changed = true
			}
			merged = appendTurn(merged, t.Role, t.Content)
		}
		turns = merged
		if !changed {
			break
		}
	}
	// tool_result blocks first in their turn, in their order.
	for i := range turns {
		if turns[i].Role == roleUser {
			slices.SortStableFunc(turns[i].Content, func(a, b Block) int {
				return boolRank(a.Type != blockToolResult) - boolRank(b.Type != blockToolResult)
			})
		}
	}
	return turns
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// toolID is id with every character the API does not allow in a tool_use
// ID (it takes letters, digits, _ and -) turned into _: agenthost names a
// call the model left unnamed run_….t1.0, say.
func toolID(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// stopSequences reads a stop param: a string or a list of strings; blank
// ones are left out.
func stopSequences(v any) []string {
	var out []string
	add := func(x any) {
		if s, ok := x.(string); ok && strings.TrimSpace(s) != "" {
			out = append(out, s)
		}
	}
	if list, ok := v.([]any); ok {
		for _, x := range list {
			add(x)
		}
	} else {
		add(v)
	}
	return out
}

// toolChoice reads the tool_choice param: "auto", "any", "none", OpenAI's
// "required" (sent as "any"), any other string as the one tool to call,
// and an object as it is; anything else is not sent.
func toolChoice(v any) map[string]any {
	switch v := v.(type) {
	case string:
		switch s := strings.TrimSpace(v); s {
		case "":
			return nil
		case "auto", "any", "none":
			return map[string]any{"type": s}
		case "required":
			return map[string]any{"type": "any"}
		default:
			return map[string]any{"type": "tool", "name": s}
		}
	case map[string]any:
		return v
	}
	return nil
}

// HTTPRequest is the agenthost_http (or agenthost_http_open, with the
// config's Stream) request for a model request.
func HTTPRequest(c Config, req abi.ModelRequest) (abi.HTTPRequest, error) {
	body, err := Encode(c, req)
	if err != nil {
		return abi.HTTPRequest{}, err
	}
	h := map[string]string{"content-type": "application/json", "accept": "application/json", "anthropic-version": APIVersion}
	if c.Stream {
		h["accept"] = "text/event-stream"
	}
	if c.APIKey != "" {
		h["x-api-key"] = c.APIKey
	}
	return abi.HTTPRequest{Method: "POST", URL: c.BaseURL + "/v1/messages", Headers: h, Body: string(body), TimeoutMS: c.TimeoutMS}, nil
}

// retriableErrors are the error types worth asking again for, whatever
// the status they come with.
var retriableErrors = map[string]bool{
	"rate_limit_error": true,
	"overloaded_error": true,
	"api_error":        true,
	"timeout_error":    true,
}

// Decode turns agenthost_http's response into the effect's reply: done
// with the assistant message and usage, or failed.
//
// 429 (rate_limit_error), 529 (overloaded_error) and any 5xx are
// retriable, as are a timeout and a failed connection; any other 4xx
// (invalid_request_error, authentication_error, permission_error,
// not_found_error, request_too_large), a denied host and a body this
// plugin cannot read are not. A failure carries the server's error type
// and message, its request ID, and the wait its retry-after header asks
// for.
//
// stop_reason: end_turn, stop_sequence and tool_use answer with the text
// and calls; max_tokens (and model_context_window_exceeded) answer with
// the text cut short, but fail, not retriable, when the answer calls a
// tool, since its input may be cut too; refusal fails, not retriable;
// pause_turn (a server tool's turn, which this plugin never asks for)
// fails, retriable.
func Decode(resp abi.HTTPResponse) abi.EffectReply {
	if e := resp.Error; e != nil {
		switch e.Code {
		case abi.HTTPDenied:
			return abi.Failed("anthropic: the host refused the request: "+e.Message+"; add the API's host to this plugin's allowed_hosts", false)
		case abi.HTTPTimeout, abi.HTTPFailed:
			return abi.Failed(fmt.Sprintf("anthropic: request %s: %s", e.Code, e.Message), true)
		default:
			return abi.Failed(fmt.Sprintf("anthropic: request %s: %s", e.Code, e.Message), false)
		}
	}
	if resp.Status < 200 || resp.Status > 299 {
		return serverError(resp)
	}
	var r Response
	if err := json.Unmarshal([]byte(resp.Body), &r); err != nil {
		return abi.Failed("anthropic: the response is not a message: "+err.Error()+": "+clip(resp.Body), false)
	}
	if r.Type == "error" {
		return serverError(resp)
	}
	if r.Type != "message" {
		return abi.Failed(fmt.Sprintf("anthropic: the response is of type %q, not a message: %s", r.Type, clip(resp.Body)), false)
	}
	return reply(r)
}

// reply is the reply for a message, whole or assembled from a stream:
// done with its text, its calls and the usage, or failed, by its stop
// reason and its calls' inputs.
func reply(r Response) abi.EffectReply {
	msg := abi.Message{Role: abi.MessageAssistant}
	var text strings.Builder
	seen := map[string]bool{}
	for i, b := range r.Content {
		switch b.Type {
		case blockText:
			text.WriteString(b.Text)
		case blockToolUse:
			input := strings.TrimSpace(string(b.Input))
			if input == "" || input == "null" {
				input = "{}"
			}
			var obj map[string]any
			if err := json.Unmarshal([]byte(input), &obj); err != nil || obj == nil {
				// Asking again may well go better.
				return abi.Failed(fmt.Sprintf("anthropic: the model's call of %q (block %d) has an input that is not a JSON object: %s", b.Name, i, clip(input)), true)
			}
			id := b.ID
			if id == "" || seen[id] {
				id = fmt.Sprintf("toolu_%d", i)
			}
			seen[id] = true
			msg.ToolCalls = append(msg.ToolCalls, abi.ToolCall{ID: id, Name: b.Name, Arguments: json.RawMessage(input)})
		}
	}
	msg.Content = text.String()
	switch r.StopReason {
	case "refusal":
		return abi.Failed("anthropic: the model declined to answer (stop_reason refusal)"+said(msg.Content), false)
	case "pause_turn":
		return abi.Failed("anthropic: the server paused the turn (stop_reason pause_turn), which only server tools do and this plugin sends none; asking again", true)
	case "max_tokens", "model_context_window_exceeded":
		if len(msg.ToolCalls) > 0 {
			return abi.Failed(fmt.Sprintf("anthropic: the answer was cut off (stop_reason %s) while it called %q, whose input may be cut too: raise max_output_tokens in the agent's settings or max_tokens in the plugin's config", r.StopReason, msg.ToolCalls[len(msg.ToolCalls)-1].Name), false)
		}
	}
	u := r.Usage
	out := abi.ModelOutcome{Message: msg, Usage: abi.Usage{
		InputTokens:  max(u.InputTokens, 0) + max(u.CacheCreationInputTokens, 0) + max(u.CacheReadInputTokens, 0),
		OutputTokens: max(u.OutputTokens, 0),
	}}
	if err := abi.ValidateModelOutcome(out); err != nil {
		return abi.Failed("anthropic: the model's answer breaks the ABI: "+err.Error(), true)
	}
	return abi.DoneModel(out)
}

// serverError is the failed reply for an error response: its status, its
// error type and message, its request ID and its retry-after.
func serverError(resp abi.HTTPResponse) abi.EffectReply {
	var e ErrorBody
	var what string
	if json.Unmarshal([]byte(resp.Body), &e) == nil && (e.Error.Type != "" || e.Error.Message != "") {
		what = e.describe()
	} else if strings.TrimSpace(resp.Body) == "" {
		what = "(no body)"
	} else {
		what = clip(resp.Body)
	}
	msg := fmt.Sprintf("anthropic: the server answered %d %s", resp.Status, what)
	var waitMS int64
	if wait := header(resp.Headers, "retry-after"); wait != "" {
		if secs, err := strconv.ParseInt(wait, 10, 64); err == nil && secs >= 0 {
			waitMS = min(secs, maxRetryAfterSeconds) * 1000
			wait += " s"
		}
		msg += "; it asks to retry after " + wait
	}
	return errorReply(msg, resp.Status, e.Error.Type, waitMS)
}

// describe is the error's type and message, and its request ID: "TYPE:
// MESSAGE (request ID)".
func (e ErrorBody) describe() string {
	what := e.Error.Type
	if e.Error.Message != "" {
		what = strings.TrimPrefix(what+": "+e.Error.Message, ": ")
	}
	if e.RequestID != "" {
		what += " (request " + e.RequestID + ")"
	}
	return what
}

// errorReply is the failed reply with msg for an error of status (0 for
// an error event in a stream) and type errType: rate_limited (waiting
// waitMS) for a rate limit (429 rate_limit_error) or an overloaded API
// (529 overloaded_error), which say "come back later": the host waits as
// asked, on a budget of attempts of their own (docs/ABI.md,
// rate_limited). Other 5xx and the retriable error types are retriable;
// the rest are not.
func errorReply(msg string, status int, errType string, waitMS int64) abi.EffectReply {
	if status == 429 || status == 529 || errType == "rate_limit_error" || errType == "overloaded_error" {
		return abi.RateLimited(msg, waitMS)
	}
	return abi.Failed(msg, status >= 500 || retriableErrors[errType])
}

// maxRetryAfterSeconds bounds the wait a retry-after header can ask for:
// a day.
const maxRetryAfterSeconds = 24 * 60 * 60

// header is the value of the response header name, whatever its case.
func header(h map[string]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// said is ": " and the text, clipped, or nothing for no text.
func said(text string) string {
	if strings.TrimSpace(text) == "" {
		return ""
	}
	return ": " + clip(text)
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
