// Package chat maps agenthost's model requests to OpenAI-compatible
// chat-completions requests (OpenAI, Ollama, vLLM …) and their responses
// back to model outcomes, whole or streamed (stream.go). It is plain Go,
// so its tests run on the host; the plugin (package main, built for
// wasip1) reads the config and calls Call with the host's functions.
package chat

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Config is the plugin's configuration: BaseURL such as
// https://api.openai.com/v1 or http://localhost:11434/v1, Model such as
// gpt-4o-mini; APIKey is sent as "Authorization: Bearer …" when set;
// MaxTokens (0: not sent) and Temperature are sent when set.
type Config = modelcall.Config

// configSpec is how this plugin reads the shared keys: base_url is
// required.
var configSpec = modelcall.ConfigSpec{
	Plugin:         "openai",
	BaseURLExample: "https://api.openai.com/v1 or http://localhost:11434/v1 for Ollama",
	ModelExample:   "gpt-4o-mini",
}

// ParseConfig reads the config through get (the plugin passes Extism's
// config_get). base_url and model are required; stream is true unless
// set to false; a value of the wrong type is an error that names the
// key.
func ParseConfig(get func(string) (string, bool)) (Config, error) {
	c, problems := modelcall.ParseConfig(get, configSpec)
	if err := modelcall.Err(configSpec.Plugin, problems); err != nil {
		return Config{}, err
	}
	return c, nil
}

// The wire shapes of chat completions, as far as this plugin uses them.
type (
	// Request is the body of POST {base_url}/chat/completions.
	Request struct {
		Model       string    `json:"model"`
		Messages    []Message `json:"messages"`
		Tools       []Tool    `json:"tools,omitempty"`
		Temperature *float64  `json:"temperature,omitempty"`
		MaxTokens   *int      `json:"max_tokens,omitempty"`
		// Stream asks for the answer as a stream of chunks, and
		// StreamOptions for its usage in a last chunk.
		Stream        bool           `json:"stream,omitempty"`
		StreamOptions *StreamOptions `json:"stream_options,omitempty"`
		// ResponseFormat asks for an answer that matches a JSON Schema:
		// the agent's output schema, when it has one.
		ResponseFormat *ResponseFormat `json:"response_format,omitempty"`
	}
	// StreamOptions is {"include_usage": true}: the stream's last chunk
	// before [DONE] has the usage, and no choices.
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	}
	// ResponseFormat is {"type": "json_schema", "json_schema": …}.
	ResponseFormat struct {
		Type       string     `json:"type"`
		JSONSchema JSONSchema `json:"json_schema"`
	}
	// JSONSchema names a schema for structured outputs. Strict is false:
	// strict mode takes only a subset of JSON Schema (every property
	// required, additionalProperties false), and agenthost checks the
	// answer against the whole schema anyway.
	JSONSchema struct {
		Name   string         `json:"name"`
		Schema map[string]any `json:"schema"`
		Strict bool           `json:"strict"`
	}
	// Message is a chat message. Content is a pointer: an assistant message
	// that only calls tools sends null, as the API documents.
	Message struct {
		Role       string     `json:"role"`
		Content    *string    `json:"content"`
		ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
		ToolCallID string     `json:"tool_call_id,omitempty"`
	}
	// ToolCall is a function call; its arguments are a JSON document in a
	// string.
	ToolCall struct {
		ID       string       `json:"id"`
		Type     string       `json:"type"`
		Function FunctionCall `json:"function"`
	}
	FunctionCall struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	// Tool is a function tool.
	Tool struct {
		Type     string   `json:"type"`
		Function Function `json:"function"`
	}
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	}
	// Response is the body of a successful response.
	Response struct {
		Choices []Choice `json:"choices"`
		Usage   Usage    `json:"usage"`
	}
	// Choice is one of a response's answers; the plugin reads the first.
	Choice struct {
		Message      Message `json:"message"`
		FinishReason string  `json:"finish_reason"`
	}
	// Usage is the tokens the server counted.
	Usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	}
)

// OutputSchemaName is the name response_format gives the agent's output
// schema (the API requires one).
const OutputSchemaName = "output"

// emptySchema is what a tool with no input schema takes: no arguments.
var emptySchema = json.RawMessage(`{"type":"object","properties":{}}`)

// Encode makes the chat-completions request body for a model request.
// With the config's Stream it asks for a stream, with the usage at its
// end (stream_options.include_usage). The request's params (most often the Run's agent's settings) override
// the config: "model" (string), "temperature" (number), and
// "max_output_tokens" or "max_tokens" (integer, sent as max_tokens); and
// "output_schema" (an object: the agent's output schema) is sent as
// response_format {"type": "json_schema", "json_schema": {"name":
// OutputSchemaName, "schema": …, "strict": false}}. Other params are not
// sent: they may be meant for another executor.
func Encode(c Config, req abi.ModelRequest) ([]byte, error) {
	out := Request{Model: c.Model, Temperature: c.Temperature}
	if c.MaxTokens > 0 {
		n := c.MaxTokens
		out.MaxTokens = &n
	}
	if c.Stream {
		out.Stream, out.StreamOptions = true, &StreamOptions{IncludeUsage: true}
	}
	if v, ok := req.Params[abi.ParamModel].(string); ok && strings.TrimSpace(v) != "" {
		out.Model = strings.TrimSpace(v)
	}
	if v, ok := req.Params[abi.ParamTemperature].(float64); ok {
		out.Temperature = &v
	}
	for _, key := range []string{"max_tokens", abi.ParamMaxOutputTokens} {
		if v, ok := req.Params[key].(float64); ok && v > 0 {
			n := int(v)
			out.MaxTokens = &n
		}
	}
	if s, ok := req.Params[abi.ParamOutputSchema].(map[string]any); ok {
		out.ResponseFormat = &ResponseFormat{Type: "json_schema", JSONSchema: JSONSchema{Name: OutputSchemaName, Schema: s}}
	}
	for _, m := range req.Messages {
		cm := Message{Role: m.Role, ToolCallID: m.ToolCallID}
		content := m.Content
		cm.Content = &content
		for _, tc := range m.ToolCalls {
			args := string(tc.Arguments)
			if len(tc.Arguments) == 0 || args == "null" {
				args = "{}"
			}
			cm.ToolCalls = append(cm.ToolCalls, ToolCall{ID: tc.ID, Type: "function", Function: FunctionCall{Name: tc.Name, Arguments: args}})
		}
		if m.Role == abi.MessageAssistant && len(cm.ToolCalls) > 0 && m.Content == "" {
			cm.Content = nil
		}
		out.Messages = append(out.Messages, cm)
	}
	for _, t := range req.Tools {
		params := t.InputSchema
		if len(params) == 0 {
			params = emptySchema
		}
		out.Tools = append(out.Tools, Tool{Type: "function", Function: Function{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	return json.Marshal(out)
}

// HTTPRequest is the agenthost_http (or agenthost_http_open, with the
// config's Stream) request for a model request.
func HTTPRequest(c Config, req abi.ModelRequest) (abi.HTTPRequest, error) {
	body, err := Encode(c, req)
	if err != nil {
		return abi.HTTPRequest{}, err
	}
	h := map[string]string{"content-type": "application/json", "accept": "application/json"}
	if c.Stream {
		h["accept"] = "text/event-stream"
	}
	if c.APIKey != "" {
		h["authorization"] = "Bearer " + c.APIKey
	}
	return abi.HTTPRequest{Method: "POST", URL: c.BaseURL + "/chat/completions", Headers: h, Body: string(body), TimeoutMS: c.TimeoutMS}, nil
}

// Decode turns agenthost_http's response into the effect's reply: done
// with the assistant message and usage, or failed. 429 and 5xx are
// retriable, as are a timeout and a failed connection; any other 4xx, a
// denied host and a body this plugin cannot read are not.
//
// A 429, and a 503 that says when to come back, is rate_limited
// (abi.RateLimited), with the wait the server asked for (RetryAfter; now
// is the host clock, for a Retry-After date when the response has no
// Date). A 429 whose error is insufficient_quota (the account's quota,
// not a rate) is a plain failure, not retriable: waiting does not help.
// Another 5xx that says when to come back carries the wait too.
func Decode(resp abi.HTTPResponse, now time.Time) abi.EffectReply {
	if e := resp.Error; e != nil {
		switch e.Code {
		case abi.HTTPDenied:
			return abi.Failed("openai: the host refused the request: "+e.Message+"; add the API's host to this plugin's allowed_hosts", false)
		case abi.HTTPTimeout, abi.HTTPFailed:
			return abi.Failed(fmt.Sprintf("openai: request %s: %s", e.Code, e.Message), true)
		default:
			return abi.Failed(fmt.Sprintf("openai: request %s: %s", e.Code, e.Message), false)
		}
	}
	if resp.Status < 200 || resp.Status > 299 {
		msg := fmt.Sprintf("openai: the server answered %d: %s", resp.Status, serverMessage(resp.Body))
		wait, said := RetryAfter(resp.Headers, now)
		switch {
		case resp.Status == 429 && quotaExhausted(resp.Body):
			return abi.Failed(msg+" (the account's quota is used up: retrying does not help)", false)
		case resp.Status == 429 || (resp.Status == 503 && said):
			return abi.RateLimited(msg, wait.Milliseconds())
		case resp.Status >= 500:
			r := abi.Failed(msg, true)
			r.Error.RetryAfterMS = wait.Milliseconds()
			return r
		}
		return abi.Failed(msg, false)
	}
	var r Response
	if err := json.Unmarshal([]byte(resp.Body), &r); err != nil {
		return abi.Failed("openai: the response is not a chat completion: "+err.Error()+": "+clip(resp.Body), false)
	}
	if len(r.Choices) == 0 {
		return abi.Failed("openai: the response has no choices: "+clip(resp.Body), false)
	}
	return reply(r)
}

// reply is the reply for a response with at least one choice, whole or
// assembled from a stream: done with its first choice's message and the
// usage, or failed when a call's arguments are not a JSON object.
func reply(r Response) abi.EffectReply {
	cm := r.Choices[0].Message
	msg := abi.Message{Role: abi.MessageAssistant}
	if cm.Content != nil {
		msg.Content = *cm.Content
	}
	seen := map[string]bool{}
	for i, tc := range cm.ToolCalls {
		args := strings.TrimSpace(tc.Function.Arguments)
		if args == "" {
			args = "{}"
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(args), &obj); err != nil || obj == nil {
			// The model wrote arguments that are not a JSON object: asking
			// again may well go better.
			return abi.Failed(fmt.Sprintf("openai: the model's call %d of %q has arguments that are not a JSON object: %s", i, tc.Function.Name, clip(args)), true)
		}
		id := tc.ID
		if id == "" || seen[id] {
			id = fmt.Sprintf("call_%d", i)
		}
		seen[id] = true
		msg.ToolCalls = append(msg.ToolCalls, abi.ToolCall{ID: id, Name: tc.Function.Name, Arguments: json.RawMessage(args)})
	}
	out := abi.ModelOutcome{Message: msg, Usage: abi.Usage{InputTokens: max(r.Usage.PromptTokens, 0), OutputTokens: max(r.Usage.CompletionTokens, 0)}}
	if err := abi.ValidateModelOutcome(out); err != nil {
		return abi.Failed("openai: the model's answer breaks the ABI: "+err.Error(), true)
	}
	return abi.DoneModel(out)
}

// MaxRetryAfter bounds the wait RetryAfter reads from a response: a
// header that asks for more is read as this. (The host's policy bounds
// the wait again, by its max_retry_after.)
const MaxRetryAfter = 24 * time.Hour

// RetryAfter reads from a response's headers how long the server asked
// to wait before the next request, and whether it said at all. It reads,
// in this order, the first that parses:
//
//   - retry-after-ms: milliseconds (OpenAI's own header);
//   - Retry-After (RFC 9110): delta-seconds, or an HTTP-date, which is
//     taken relative to the response's Date header, or to now when the
//     response has none (a date in the past is no wait);
//   - x-ratelimit-reset-requests and x-ratelimit-reset-tokens (OpenAI's):
//     durations such as "1s", "6m0s" or "20ms", until the limit resets.
//     Of the limits whose x-ratelimit-remaining-… is 0, the longest
//     reset; when neither says 0, the shortest reset given.
//
// Header names are matched without regard to case; a value that does
// not parse, or is negative, is skipped. The wait is at most
// MaxRetryAfter.
func RetryAfter(headers map[string]string, now time.Time) (time.Duration, bool) {
	h := func(name string) (string, bool) {
		for k, v := range headers {
			if strings.EqualFold(k, name) {
				return strings.TrimSpace(v), true
			}
		}
		return "", false
	}
	bound := func(d time.Duration) (time.Duration, bool) { return min(max(d, 0), MaxRetryAfter), true }
	if v, ok := h("retry-after-ms"); ok {
		if d, ok := decimal(v, time.Millisecond); ok {
			return bound(d)
		}
	}
	if v, ok := h("retry-after"); ok {
		if d, ok := decimal(v, time.Second); ok {
			return bound(d)
		}
		if at, ok := httpDate(v); ok {
			if d, ok := h("date"); ok {
				if server, ok := httpDate(d); ok {
					now = server
				}
			}
			return bound(at.Sub(now))
		}
	}
	var exhausted, given []time.Duration
	for _, limit := range []string{"requests", "tokens"} {
		v, ok := h("x-ratelimit-reset-" + limit)
		if !ok {
			continue
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			continue
		}
		given = append(given, d)
		if left, ok := h("x-ratelimit-remaining-" + limit); ok && left == "0" {
			exhausted = append(exhausted, d)
		}
	}
	switch {
	case len(exhausted) > 0:
		return bound(slicesMax(exhausted))
	case len(given) > 0:
		return bound(slicesMin(given))
	}
	return 0, false
}

// decimal reads a count of unit written as digits with an optional
// fraction ("20", "1.5"), as at most MaxRetryAfter.
func decimal(s string, unit time.Duration) (time.Duration, bool) {
	if s == "" || strings.Trim(s, "0123456789.") != "" || strings.Count(s, ".") > 1 || s == "." {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	if f >= float64(MaxRetryAfter/unit) {
		return MaxRetryAfter, true
	}
	return time.Duration(f * float64(unit)), true
}

// httpDate parses an HTTP-date in any of the three forms RFC 9110 lets a
// recipient accept: IMF-fixdate, RFC 850 and asctime.
func httpDate(s string) (time.Time, bool) {
	for _, layout := range []string{"Mon, 02 Jan 2006 15:04:05 GMT", "Monday, 02-Jan-06 15:04:05 GMT", "Mon Jan _2 15:04:05 2006"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

func slicesMax(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds[1:] {
		m = max(m, d)
	}
	return m
}

func slicesMin(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds[1:] {
		m = min(m, d)
	}
	return m
}

// quotaExhausted reports an OpenAI error body whose code or type is
// insufficient_quota: the account has no quota left, which no wait
// restores.
func quotaExhausted(body string) bool {
	var e struct {
		Error struct {
			Code json.RawMessage `json:"code"`
			Type string          `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) != nil {
		return false
	}
	var code string
	_ = json.Unmarshal(e.Error.Code, &code)
	return code == "insufficient_quota" || e.Error.Type == "insufficient_quota"
}

// serverMessage is the error message in an OpenAI-style error body
// ({"error": {"message": …}}), or the body itself, clipped.
func serverMessage(body string) string {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal([]byte(body), &e) == nil && len(e.Error) > 0 {
		var obj struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(e.Error, &obj) == nil && obj.Message != "" {
			return obj.Message
		}
		var s string
		if json.Unmarshal(e.Error, &s) == nil && s != "" { // Ollama: {"error": "…"}
			return s
		}
	}
	if strings.TrimSpace(body) == "" {
		return "(no body)"
	}
	return clip(body)
}

func clip(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}
