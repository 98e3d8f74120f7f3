package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// FakeOpenAI is an OpenAI chat-completions server on 127.0.0.1 for tests,
// written from the API's public reference: it takes POST
// /v1/chat/completions with content-type application/json, and, when
// made with an API key, "Authorization: Bearer KEY"; it checks the body
// as strictly as the reference describes it: the top-level fields it
// knows, model, messages (roles system, developer, user, assistant and
// tool; content a string, text parts, or null only for an assistant that
// calls tools), tool calls (an ID, type function, a name, arguments as a
// string) each answered by a tool message right after the assistant's,
// and every tool message answering one; tools (type function, a valid,
// unique name, parameters an object), tool_choice only with tools,
// temperature 0 to 2, max_tokens an integer ≥ 1, response_format,
// stream_options only with stream. A request that breaks a rule is
// answered 400 invalid_request_error (401 for a wrong key), as the API
// does, and fails the test.
//
// It answers a valid request, in this order:
//
//   - with the next failure queued by FailNext, if any;
//   - with what the script (Script) answers, if it answers;
//   - to a last user message "answer N", with status N and the error
//     body the reference gives for it;
//   - to a conversation that ends with tool messages, with the text
//     "done: " and their contents, joined by ", " (finish_reason stop);
//   - to a last user message "use TOOL", with a call of TOOL with the
//     arguments {"expression":"6*7"} and no text (finish_reason
//     tool_calls); TOOL must be one of the request's tools;
//   - else with the text "hello from MODEL".
//
// Usage is 10 prompt tokens per message of the request and 5 completion
// tokens. A call's ID is call_ and the number of messages, so two hosts
// sent the same requests get the same answers.
//
// A request with "stream": true is answered with the same answer as a
// stream of chunks (text/event-stream, "data: {chunk}" and a blank line
// each, no event names), as the reference shows them: a first chunk with
// the role, the text in pieces of at most 4 runes, each tool call's
// first piece (index, id, type, name, empty arguments) and its arguments
// in pieces of at most 4 runes, a chunk with the finish_reason, with
// stream_options.include_usage a last chunk with no choices and the
// usage, then "data: [DONE]"; each is flushed as it is written. Hold and
// CutNext stop the next streamed answers after some of their deltas (a
// chunk with a piece of text or of a call). For tests; not a stable API.
type FakeOpenAI struct {
	// URL is the base URL for the plugin's config
	// (http://127.0.0.1:PORT/v1), Addr its host:port for allowed_hosts.
	URL, Addr string

	tb     testing.TB
	apiKey string
	srv    *http.Server

	mu       sync.Mutex
	requests []*OpenAIRequest
	failures []OpenAIFailure
	script   func(OpenAIRequest) (OpenAIAnswer, bool)
	streams  fakeStreams
}

// OpenAIRequest is a request FakeOpenAI found valid, decoded, with when
// it came and how it was answered.
type OpenAIRequest struct {
	Model       string          `json:"model"`
	Messages    []OpenAIMessage `json:"-"`
	Temperature *float64        `json:"temperature"`
	MaxTokens   *int            `json:"max_tokens"`
	ToolChoice  json.RawMessage `json:"tool_choice"`
	Tools       []struct {
		Type     string `json:"type"`
		Function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	ResponseFormat json.RawMessage `json:"response_format"`
	Stream         bool            `json:"stream"`
	StreamOptions  *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// Body is the whole body, as sent; Authorization the header, and
	// Traceparent the W3C trace context the request carried ("" if none).
	Body          json.RawMessage `json:"-"`
	Authorization string          `json:"-"`
	Traceparent   string          `json:"-"`
	// Received is when the request came; Answered when its answer was
	// sent (a streamed one: when its head was), with Status.
	Received, Answered time.Time `json:"-"`
	Status             int       `json:"-"`
}

// OpenAIMessage is one message of a request. Content is its text (text
// parts joined), nil when it is null.
type OpenAIMessage struct {
	Role       string           `json:"role"`
	Content    *string          `json:"-"`
	ToolCalls  []OpenAIToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	Name       string           `json:"name"`
}

// Text is the message's content, "" when it is null.
func (m OpenAIMessage) Text() string {
	if m.Content == nil {
		return ""
	}
	return *m.Content
}

// OpenAIToolCall is a tool call of an assistant message, or of an answer
// (Type is then "function" whatever it says).
type OpenAIToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// OpenAICall is a tool call: a shorthand for OpenAIToolCall.
func OpenAICall(id, name, arguments string) OpenAIToolCall {
	c := OpenAIToolCall{ID: id, Type: "function"}
	c.Function.Name, c.Function.Arguments = name, arguments
	return c
}

// System is the request's system and developer messages' text, joined
// by a blank line.
func (r OpenAIRequest) System() string {
	var parts []string
	for _, m := range r.Messages {
		if m.Role == "system" || m.Role == "developer" {
			parts = append(parts, m.Text())
		}
	}
	return strings.Join(parts, "\n\n")
}

// LastUser is the text of the request's last user message.
func (r OpenAIRequest) LastUser() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if r.Messages[i].Role == "user" {
			return r.Messages[i].Text()
		}
	}
	return ""
}

// ToolNames are the names of the request's tools, in order.
func (r OpenAIRequest) ToolNames() []string {
	out := []string{}
	for _, t := range r.Tools {
		out = append(out, t.Function.Name)
	}
	return out
}

// OpenAIAnswer is an answer of the script: an assistant message, its
// text and tool calls, with the finish reason (default stop, or
// tool_calls when it calls tools) and the usage (default, when both are
// 0: 10 prompt tokens per message and 5 completion tokens); or, with
// Failure, that failure.
type OpenAIAnswer struct {
	Content          string
	ToolCalls        []OpenAIToolCall
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
	Failure          *OpenAIFailure
}

// OpenAIFailure is an error answer: its status, and the error body
// {"error": {"message", "type", "param", "code"}} (the reference's type
// and code for the status when left empty), with Retry-After when
// RetryAfter is set and any other Headers. With InStream, a request that
// streams is answered 200 and the answer's stream, which after
// AfterDeltas of its deltas sends the error body as a chunk and ends; a
// request that does not stream is answered the error status.
type OpenAIFailure struct {
	Status      int
	Type, Code  string
	Message     string
	RetryAfter  string
	Headers     map[string]string
	InStream    bool
	AfterDeltas int
}

// openAIErrors are the reference's error messages, types and codes, by
// status.
var openAIErrors = map[int][3]string{
	400: {"Invalid request", "invalid_request_error", ""},
	401: {"Incorrect API key provided", "invalid_request_error", "invalid_api_key"},
	403: {"You are not allowed to access this model", "invalid_request_error", "unsupported_country_region_territory"},
	404: {"The model does not exist or you do not have access to it", "invalid_request_error", "model_not_found"},
	429: {"Rate limit reached for requests", "requests", "rate_limit_exceeded"},
	500: {"The server had an error while processing your request. Sorry about that!", "server_error", ""},
	503: {"The engine is currently overloaded, please try again later", "server_error", ""},
}

// NewFakeOpenAI starts a FakeOpenAI, closed when tb ends. With an apiKey
// it takes only requests that carry it; with none, only requests that
// carry no key (a local server's way, such as Ollama's).
func NewFakeOpenAI(tb testing.TB, apiKey string) *FakeOpenAI {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &FakeOpenAI{tb: tb, apiKey: apiKey, Addr: ln.Addr().String()}
	f.URL = "http://" + f.Addr + "/v1"
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve)}
	go func() { _ = f.srv.Serve(ln) }()
	tb.Cleanup(func() {
		f.streams.releaseAll()
		_ = f.srv.Shutdown(context.Background())
	})
	return f
}

// FailNext queues failures: the next valid requests are answered with
// them, in order, before the script resumes.
func (f *FakeOpenAI) FailNext(failures ...OpenAIFailure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, failures...)
}

// Script answers the valid requests that FailNext does not: fn is called
// with each (from the request's goroutine; it may block) and answers
// with ok, or leaves the request to the default answers. A later Script
// replaces it. A script that blocks, to hold requests, must let them go
// by the end of the test: the fake's cleanup waits for the requests under
// way, and a t.Cleanup registered after NewFakeOpenAI runs before it.
func (f *FakeOpenAI) Script(fn func(req OpenAIRequest) (answer OpenAIAnswer, ok bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.script = fn
}

// Hold holds the next streamed answer open after n of its deltas (or
// before its end, when it has fewer), until the hold's Release: a test
// sees the deltas so far arrive while the answer is not complete. Holds
// queue: each is taken by the next streamed answer.
func (f *FakeOpenAI) Hold(n int) *StreamHold { return f.streams.hold(n) }

// CutNext cuts the next streamed answer short after n of its deltas (or
// before its end, when it has fewer), the way how says; cuts queue, as
// holds do.
func (f *FakeOpenAI) CutNext(n int, how StreamCut) { f.streams.cut(n, how) }

// Requests returns the valid requests so far, the failed ones included,
// in the order they came.
func (f *FakeOpenAI) Requests() []OpenAIRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]OpenAIRequest, len(f.requests))
	for i, r := range f.requests {
		out[i] = *r
	}
	return out
}

// Count is the number of valid requests so far.
func (f *FakeOpenAI) Count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

func (f *FakeOpenAI) serve(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	req, status, err := f.check(r)
	if err != nil {
		f.tb.Errorf("fake OpenAI: %v", err)
		f.answerError(w, nil, OpenAIFailure{Status: status, Message: err.Error()})
		return
	}
	req.Received = received
	f.mu.Lock()
	f.requests = append(f.requests, req)
	var failure *OpenAIFailure
	if len(f.failures) > 0 {
		failure = &f.failures[0]
		f.failures = f.failures[1:]
	}
	script := f.script
	f.mu.Unlock()
	var a OpenAIAnswer
	scripted := false
	if failure == nil && script != nil {
		a, scripted = script(*req)
		failure = a.Failure
	}
	switch {
	case failure != nil && failure.InStream && req.Stream:
		a = OpenAIAnswer{Content: "This answer will not be finished, whatever it was going to say."}
	case failure != nil:
		f.answerError(w, req, *failure)
		return
	case scripted:
	default:
		var ok bool
		if a, ok = f.defaultAnswer(w, req); !ok {
			return
		}
	}
	f.answer(r.Context(), w, req, a, failure)
}

// defaultAnswer is the answer of the rules in FakeOpenAI's doc; false
// when it answered an error itself.
func (f *FakeOpenAI) defaultAnswer(w http.ResponseWriter, req *OpenAIRequest) (OpenAIAnswer, bool) {
	last := req.Messages[len(req.Messages)-1]
	var results []string
	for i := len(req.Messages) - 1; i >= 0 && req.Messages[i].Role == "tool"; i-- {
		results = append([]string{req.Messages[i].Text()}, results...)
	}
	text := strings.TrimSpace(last.Text())
	switch {
	case last.Role == "user" && strings.HasPrefix(text, "answer "):
		status, err := strconv.Atoi(strings.TrimPrefix(text, "answer "))
		if err != nil || status < 400 || status > 599 {
			f.tb.Errorf("fake OpenAI: %q: want answer 4xx or 5xx", text)
			status = 400
		}
		f.answerError(w, req, OpenAIFailure{Status: status})
		return OpenAIAnswer{}, false
	case len(results) > 0:
		return OpenAIAnswer{Content: "done: " + strings.Join(results, ", ")}, true
	case last.Role == "user" && strings.HasPrefix(text, "use "):
		tool := strings.TrimPrefix(text, "use ")
		if !slices.Contains(req.ToolNames(), tool) {
			f.tb.Errorf("fake OpenAI: asked to use %q, which is not among the request's tools %v", tool, req.ToolNames())
		}
		return OpenAIAnswer{ToolCalls: []OpenAIToolCall{OpenAICall(fmt.Sprintf("call_%d", len(req.Messages)), tool, `{"expression":"6*7"}`)}}, true
	}
	return OpenAIAnswer{Content: "hello from " + req.Model}, true
}

// answer writes a, whole or streamed as req asks. With failure (an
// InStream one), the stream sends it after failure.AfterDeltas deltas
// instead of the rest.
func (f *FakeOpenAI) answer(ctx context.Context, w http.ResponseWriter, req *OpenAIRequest, a OpenAIAnswer, failure *OpenAIFailure) {
	id := fmt.Sprintf("chatcmpl-%d", len(req.Messages))
	finish := a.FinishReason
	if finish == "" {
		finish = "stop"
		if len(a.ToolCalls) > 0 {
			finish = "tool_calls"
		}
	}
	prompt, completion := a.PromptTokens, a.CompletionTokens
	if prompt == 0 && completion == 0 {
		prompt, completion = 10*len(req.Messages), 5
	}
	usage := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	calls := make([]OpenAIToolCall, len(a.ToolCalls))
	for i, c := range a.ToolCalls {
		c.Type = "function"
		calls[i] = c
	}
	f.answered(req, http.StatusOK)
	w.Header().Set("x-request-id", "req_fake")
	if !req.Stream {
		var content any = a.Content
		if a.Content == "" && len(calls) > 0 {
			content = nil
		}
		msg := map[string]any{"role": "assistant", "content": content, "refusal": nil}
		if len(calls) > 0 {
			msg["tool_calls"] = calls
		}
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": id, "object": "chat.completion", "created": 1700000000, "model": req.Model, "system_fingerprint": "fp_fake",
			"choices": []any{map[string]any{"index": 0, "message": msg, "logprobs": nil, "finish_reason": finish}},
			"usage":   usage,
		})
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	chunk := func(delta map[string]any, finish any) map[string]any {
		c := map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model, "system_fingerprint": "fp_fake",
			"choices": []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}}}
		if includeUsage {
			c["usage"] = nil
		}
		return c
	}
	s := f.streams.start(ctx, w)
	failed := func() bool {
		if failure == nil || s.deltas < failure.AfterDeltas {
			return false
		}
		s.event("", map[string]any{"error": openAIErrorBody(*failure)})
		return true
	}
	s.event("", chunk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil))
	if !s.begun() || failed() {
		return
	}
	for _, p := range pieces(a.Content, fakeDeltaRunes) {
		if !s.delta("", chunk(map[string]any{"content": p}, nil)) || failed() {
			return
		}
	}
	for i, c := range calls {
		first := map[string]any{"index": i, "id": c.ID, "type": "function", "function": map[string]any{"name": c.Function.Name, "arguments": ""}}
		if !s.delta("", chunk(map[string]any{"tool_calls": []any{first}}, nil)) || failed() {
			return
		}
		for _, p := range pieces(c.Function.Arguments, fakeDeltaRunes) {
			piece := map[string]any{"index": i, "function": map[string]any{"arguments": p}}
			if !s.delta("", chunk(map[string]any{"tool_calls": []any{piece}}, nil)) || failed() {
				return
			}
		}
	}
	if failure != nil { // fewer deltas than AfterDeltas
		s.event("", map[string]any{"error": openAIErrorBody(*failure)})
		return
	}
	if !s.end() {
		return
	}
	s.event("", chunk(map[string]any{}, finish))
	if includeUsage {
		s.event("", map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1700000000, "model": req.Model, "system_fingerprint": "fp_fake",
			"choices": []any{}, "usage": usage})
	}
	s.event("", "[DONE]")
}

// answered records req's answer.
func (f *FakeOpenAI) answered(req *OpenAIRequest, status int) {
	if req == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	req.Answered, req.Status = time.Now(), status
}

// openAIErrorBody is the error object of a failure: its message, type
// and code, the reference's for its status when left empty.
func openAIErrorBody(a OpenAIFailure) map[string]any {
	def, ok := openAIErrors[a.Status]
	if !ok {
		def = openAIErrors[500]
		if a.Status < 500 {
			def = openAIErrors[400]
		}
	}
	msg, typ, code := a.Message, a.Type, a.Code
	if msg == "" {
		msg = def[0]
	}
	if typ == "" {
		typ = def[1]
	}
	if code == "" {
		code = def[2]
	}
	var c any = code
	if code == "" {
		c = nil
	}
	return map[string]any{"message": msg, "type": typ, "param": nil, "code": c}
}

// answerError writes a failure: its status, headers and error body.
func (f *FakeOpenAI) answerError(w http.ResponseWriter, req *OpenAIRequest, a OpenAIFailure) {
	if a.Status == 0 {
		a.Status = http.StatusInternalServerError
	}
	for k, v := range a.Headers {
		w.Header().Set(k, v)
	}
	if a.RetryAfter != "" {
		w.Header().Set("retry-after", a.RetryAfter)
	}
	w.Header().Set("content-type", "application/json")
	w.Header().Set("x-request-id", "req_fake")
	f.answered(req, a.Status)
	w.WriteHeader(a.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": openAIErrorBody(a)})
}

// The reference's pattern for function and schema names.
var openAIName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// openAITopLevel are the request fields the reference lists.
var openAITopLevel = map[string]bool{
	"model": true, "messages": true, "tools": true, "tool_choice": true, "parallel_tool_calls": true,
	"temperature": true, "top_p": true, "n": true, "stream": true, "stream_options": true, "stop": true,
	"max_tokens": true, "max_completion_tokens": true, "presence_penalty": true, "frequency_penalty": true,
	"logit_bias": true, "logprobs": true, "top_logprobs": true, "user": true, "seed": true,
	"response_format": true, "service_tier": true, "store": true, "metadata": true, "modalities": true,
	"audio": true, "prediction": true, "reasoning_effort": true, "web_search_options": true,
	"verbosity": true, "prompt_cache_key": true, "safety_identifier": true,
}

// check reads and checks one request, returning what it read, or the
// status to answer and the first rule it breaks.
func (f *FakeOpenAI) check(r *http.Request) (*OpenAIRequest, int, error) {
	req := &OpenAIRequest{Authorization: r.Header.Get("authorization"), Traceparent: r.Header.Get("traceparent")}
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		return nil, http.StatusNotFound, fmt.Errorf("%s %s: chat completions are POST /v1/chat/completions", r.Method, r.URL.Path)
	}
	switch want := "Bearer " + f.apiKey; {
	case f.apiKey == "" && req.Authorization != "":
		return nil, http.StatusUnauthorized, fmt.Errorf("authorization is %q, and this server takes no key", req.Authorization)
	case f.apiKey != "" && req.Authorization != want:
		return nil, http.StatusUnauthorized, fmt.Errorf("authorization is %q, want %q: Incorrect API key provided", req.Authorization, want)
	}
	if ct := r.Header.Get("content-type"); !strings.HasPrefix(ct, "application/json") {
		return nil, http.StatusBadRequest, fmt.Errorf("content-type is %q, want application/json", ct)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	if err := f.checkBody(body, req); err != nil {
		return nil, http.StatusBadRequest, err
	}
	return req, 0, nil
}

// checkBody checks a request's body and fills req from it.
func (f *FakeOpenAI) checkBody(body []byte, req *OpenAIRequest) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return fmt.Errorf("the body is not a JSON object: %v", err)
	}
	for k := range top {
		if !openAITopLevel[k] {
			return fmt.Errorf("Unrecognized request argument supplied: %s", k)
		}
	}
	if err := json.Unmarshal(body, req); err != nil {
		return fmt.Errorf("the body does not decode: %v", err)
	}
	req.Body = body
	if req.Model == "" {
		return errors.New("you must provide a model parameter")
	}
	if t := req.Temperature; t != nil && (*t < 0 || *t > 2) {
		return fmt.Errorf("temperature: %v is not between 0 and 2", *t)
	}
	if raw, ok := top["max_tokens"]; ok && string(raw) != "null" {
		var n json.Number
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		if d.Decode(&n) != nil {
			return fmt.Errorf("max_tokens: %s is not an integer", raw)
		}
		if v, err := n.Int64(); err != nil || v < 1 {
			return fmt.Errorf("max_tokens: %s is not an integer of 1 or more", raw)
		}
	}
	if req.StreamOptions != nil && !req.Stream {
		return errors.New("The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	tools := map[string]bool{}
	for i, t := range req.Tools {
		if t.Type != "function" {
			return fmt.Errorf("tools[%d].type: %q is not function", i, t.Type)
		}
		if !openAIName.MatchString(t.Function.Name) || tools[t.Function.Name] {
			return fmt.Errorf("tools[%d].function.name: %q is not a valid, unique function name (letters, digits, _ and -, at most 64)", i, t.Function.Name)
		}
		tools[t.Function.Name] = true
		if len(t.Function.Parameters) > 0 {
			var schema map[string]any
			if json.Unmarshal(t.Function.Parameters, &schema) != nil || schema == nil {
				return fmt.Errorf("tools[%d].function.parameters: %s is not a JSON Schema object", i, t.Function.Parameters)
			}
		}
	}
	if len(req.ToolChoice) > 0 && len(tools) == 0 {
		return errors.New("tool_choice: 'tool_choice' is only allowed when 'tools' are specified")
	}
	if len(req.ResponseFormat) > 0 {
		var rf struct {
			Type       string `json:"type"`
			JSONSchema *struct {
				Name   string          `json:"name"`
				Schema json.RawMessage `json:"schema"`
			} `json:"json_schema"`
		}
		if json.Unmarshal(req.ResponseFormat, &rf) != nil {
			return fmt.Errorf("response_format: %s is not an object", req.ResponseFormat)
		}
		switch rf.Type {
		case "text", "json_object":
		case "json_schema":
			var schema map[string]any
			if rf.JSONSchema == nil || !openAIName.MatchString(rf.JSONSchema.Name) || json.Unmarshal(rf.JSONSchema.Schema, &schema) != nil || schema == nil {
				return errors.New("response_format.json_schema: want a valid name and a schema object")
			}
		default:
			return fmt.Errorf("response_format.type: %q is not text, json_object or json_schema", rf.Type)
		}
	}
	return f.checkMessages(top["messages"], req)
}

// checkMessages checks the messages and fills req.Messages.
func (f *FakeOpenAI) checkMessages(raw json.RawMessage, req *OpenAIRequest) error {
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil || len(msgs) == 0 {
		return errors.New("messages: want a non-empty list of messages")
	}
	pending := map[string]bool{} // tool call IDs of the last assistant message, unanswered
	for i, m := range msgs {
		p := fmt.Sprintf("messages[%d]", i)
		var msg OpenAIMessage
		b, _ := json.Marshal(m)
		if err := json.Unmarshal(b, &msg); err != nil {
			return fmt.Errorf("%s: %v", p, err)
		}
		switch msg.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return fmt.Errorf("%s.role: %q is not system, developer, user, assistant or tool", p, msg.Role)
		}
		if msg.Role != "tool" && len(pending) > 0 {
			return fmt.Errorf("%s: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'; unanswered: %v", p, keys(pending))
		}
		content, ok := m["content"]
		switch {
		case !ok || string(content) == "null":
			if msg.Role != "assistant" || len(msg.ToolCalls) == 0 {
				return fmt.Errorf("%s.content: a %s message needs content (null only for an assistant message with tool_calls)", p, msg.Role)
			}
		default:
			var s string
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if json.Unmarshal(content, &s) != nil {
				if json.Unmarshal(content, &parts) != nil {
					return fmt.Errorf("%s.content: want a string, a list of content parts or null", p)
				}
				var texts []string
				for j, part := range parts {
					if part.Type != "text" {
						return fmt.Errorf("%s.content[%d]: part type %q is not one this fake takes", p, j, part.Type)
					}
					texts = append(texts, part.Text)
				}
				s = strings.Join(texts, "")
			}
			msg.Content = &s
		}
		if len(msg.ToolCalls) > 0 && msg.Role != "assistant" {
			return fmt.Errorf("%s.tool_calls: only assistant messages call tools", p)
		}
		for j, c := range msg.ToolCalls {
			if c.ID == "" || c.Type != "function" || c.Function.Name == "" || pending[c.ID] {
				return fmt.Errorf("%s.tool_calls[%d]: want a unique id, type function and a function name: %+v", p, j, c)
			}
			pending[c.ID] = true
		}
		if msg.Role == "tool" {
			if !pending[msg.ToolCallID] {
				return fmt.Errorf("%s: messages with role 'tool' must be a response to a preceding message with 'tool_calls'; %q answers none", p, msg.ToolCallID)
			}
			delete(pending, msg.ToolCallID)
		}
		req.Messages = append(req.Messages, msg)
	}
	if len(pending) > 0 {
		return fmt.Errorf("messages: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'; unanswered: %v", keys(pending))
	}
	return nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
