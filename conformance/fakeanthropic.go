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
)

// FakeAnthropic is an Anthropic Messages API server on 127.0.0.1 for
// tests, written from the API's public reference: it takes POST
// /v1/messages with the headers x-api-key and anthropic-version:
// 2023-06-01 and a JSON body, and checks the body as strictly as the
// reference describes it: the top-level fields it knows, model,
// max_tokens (an integer ≥ 1), system (a string or text blocks),
// temperature (0 to 1), stop_sequences, tools (name, input_schema of type
// object) and tool_choice (only with tools); messages that start with the
// user, alternate user and assistant, hold non-empty text; tool_use
// blocks only in assistant turns, with IDs of letters, digits, _ and -
// and an object input; every tool_use answered by a tool_result in the
// next turn, tool_result blocks only there and before any text. A
// request that breaks a rule is answered 400 invalid_request_error, as
// the API does, and fails the test.
//
// It answers a valid request, in this order:
//
//   - with the next failure queued by FailNext, if any;
//   - to a last turn whose text is "answer N", with status N and the
//     error body the reference gives for it;
//   - to a last turn that holds tool results, with the text "done: " and
//     their contents, joined by ", " (stop_reason end_turn);
//   - to a last turn whose text is "use TOOL", with a text block and a
//     tool_use of TOOL with the input {"expression": "6*7"} (stop_reason
//     tool_use); TOOL must be one of the request's tools;
//   - else with the text "hello from MODEL" (end_turn).
//
// Usage is 10 input tokens per message of the request and 5 output
// tokens. Every answer depends on the request alone (a call's ID is
// toolu_ and the number of messages), so two hosts sent the same
// requests get the same answers.
//
// A request with "stream": true is answered with the same message as a
// stream of events (text/event-stream), as the reference shows them:
// message_start (with the input tokens), then for each content block
// content_block_start, its pieces (text_delta of at most 4 runes of
// text, input_json_delta of at most 4 of the tool's input as JSON text)
// and content_block_stop, a ping after the first block's start, then
// message_delta (stop_reason, output tokens) and message_stop; each
// event is flushed as it is written. A failure is answered as an error
// status before the stream, unless it is InStream. Hold and CutNext
// stop the next streamed answers after some of their deltas. For tests;
// not a stable API.
type FakeAnthropic struct {
	// URL is the base URL for the plugin's config (http://127.0.0.1:PORT),
	// Addr its host:port for allowed_hosts.
	URL, Addr string

	tb     testing.TB
	apiKey string
	srv    *http.Server

	mu       sync.Mutex
	requests []AnthropicRequest
	failures []AnthropicFailure
	streams  fakeStreams
}

// AnthropicRequest is a request FakeAnthropic found valid, decoded.
type AnthropicRequest struct {
	Model         string             `json:"model"`
	MaxTokens     int                `json:"max_tokens"`
	System        json.RawMessage    `json:"system"`
	Temperature   *float64           `json:"temperature"`
	StopSequences []string           `json:"stop_sequences"`
	ToolChoice    map[string]any     `json:"tool_choice"`
	Stream        bool               `json:"stream"`
	Messages      []AnthropicMessage `json:"messages"`
	Tools         []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
	// Body is the whole body, as sent.
	Body json.RawMessage `json:"-"`
}

// AnthropicMessage is one turn of a request, its content as blocks (a
// string content becomes one text block).
type AnthropicMessage struct {
	Role    string           `json:"role"`
	Content []AnthropicBlock `json:"-"`
}

// AnthropicBlock is a content block of a request.
type AnthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

// SystemText is the request's system prompt as text.
func (r AnthropicRequest) SystemText() string {
	var s string
	if json.Unmarshal(r.System, &s) == nil {
		return s
	}
	var blocks []AnthropicBlock
	_ = json.Unmarshal(r.System, &blocks)
	var parts []string
	for _, b := range blocks {
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n\n")
}

// ToolNames are the names of the request's tools, in order.
func (r AnthropicRequest) ToolNames() []string {
	out := []string{}
	for _, t := range r.Tools {
		out = append(out, t.Name)
	}
	return out
}

// AnthropicFailure is an error answer: its status, error type and
// message, and a retry-after header when RetryAfter is set. With
// InStream, a request that streams is answered 200 and the message's
// stream, which after AfterDeltas of its deltas sends the error as an
// error event ({"type": "error", "error": {"type", "message"}}) and ends;
// Status then only picks the error type when Type is empty, and a
// request that does not stream is answered the error status.
type AnthropicFailure struct {
	Status      int
	Type        string
	Message     string
	RetryAfter  string
	InStream    bool
	AfterDeltas int
}

// anthropicErrorTypes are the error types of the reference, by status.
var anthropicErrorTypes = map[int]string{
	400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
	404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
	500: "api_error", 504: "timeout_error", 529: "overloaded_error",
}

// NewFakeAnthropic starts a FakeAnthropic that takes apiKey, closed when
// tb ends.
func NewFakeAnthropic(tb testing.TB, apiKey string) *FakeAnthropic {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &FakeAnthropic{tb: tb, apiKey: apiKey, Addr: ln.Addr().String()}
	f.URL = "http://" + f.Addr
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve)}
	go func() { _ = f.srv.Serve(ln) }()
	tb.Cleanup(func() {
		f.streams.releaseAll()
		_ = f.srv.Shutdown(context.Background())
	})
	return f
}

// Hold holds the next streamed answer open after n of its deltas (or
// before its end, when it has fewer), until the hold's Release: a test
// sees the deltas so far arrive while the answer is not complete. Holds
// queue: each is taken by the next streamed answer.
func (f *FakeAnthropic) Hold(n int) *StreamHold { return f.streams.hold(n) }

// CutNext cuts the next streamed answer short after n of its deltas (or
// before its end, when it has fewer), the way how says; cuts queue, as
// holds do.
func (f *FakeAnthropic) CutNext(n int, how StreamCut) { f.streams.cut(n, how) }

// FailNext queues failures: the next valid requests are answered with
// them, in order, before the script resumes.
func (f *FakeAnthropic) FailNext(failures ...AnthropicFailure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, failures...)
}

// Requests returns the valid requests so far, the failed ones included.
func (f *FakeAnthropic) Requests() []AnthropicRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]AnthropicRequest(nil), f.requests...)
}

func (f *FakeAnthropic) serve(w http.ResponseWriter, r *http.Request) {
	req, err := f.check(r)
	if err != nil {
		f.tb.Errorf("fake Anthropic: %v", err)
		f.answerError(w, AnthropicFailure{Status: 400, Message: err.Error()})
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, req)
	var failure *AnthropicFailure
	if len(f.failures) > 0 {
		failure = &f.failures[0]
		f.failures = f.failures[1:]
	}
	f.mu.Unlock()
	last := req.Messages[len(req.Messages)-1]
	var results, texts []string
	for _, b := range last.Content {
		switch b.Type {
		case "tool_result":
			results = append(results, toolResultText(b.Content))
		case "text":
			texts = append(texts, b.Text)
		}
	}
	text := strings.TrimSpace(strings.Join(texts, " "))
	usage := map[string]any{"input_tokens": 10 * len(req.Messages), "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	answer := func(stop string, content ...map[string]any) {
		msg := map[string]any{
			"id": fmt.Sprintf("msg_%d", len(req.Messages)), "type": "message", "role": "assistant", "model": req.Model,
			"content": content, "stop_reason": stop, "stop_sequence": nil, "usage": usage,
		}
		if req.Stream {
			f.stream(r.Context(), w, msg, nil)
			return
		}
		w.Header().Set("content-type", "application/json")
		w.Header().Set("request-id", "req_fake")
		_ = json.NewEncoder(w).Encode(msg)
	}
	if failure != nil && failure.InStream && req.Stream {
		msg := map[string]any{"id": "msg_failing", "type": "message", "role": "assistant", "model": req.Model,
			"content":     []map[string]any{{"type": "text", "text": "This answer will not be finished, whatever it was going to say."}},
			"stop_reason": "end_turn", "stop_sequence": nil, "usage": usage}
		f.stream(r.Context(), w, msg, failure)
		return
	}
	if failure != nil {
		f.answerError(w, *failure)
		return
	}
	switch {
	case strings.HasPrefix(text, "answer "):
		status, err := strconv.Atoi(strings.TrimPrefix(text, "answer "))
		if err != nil || status < 400 || status > 599 {
			f.tb.Errorf("fake Anthropic: %q: want answer 4xx or 5xx", text)
			status = 400
		}
		f.answerError(w, AnthropicFailure{Status: status, Message: "the fake answers " + strconv.Itoa(status) + " as asked"})
	case len(results) > 0:
		answer("end_turn", map[string]any{"type": "text", "text": "done: " + strings.Join(results, ", ")})
	case strings.HasPrefix(text, "use "):
		tool := strings.TrimPrefix(text, "use ")
		if !slices.Contains(req.ToolNames(), tool) {
			f.tb.Errorf("fake Anthropic: asked to use %q, which is not among the request's tools %v", tool, req.ToolNames())
		}
		answer("tool_use",
			map[string]any{"type": "text", "text": "Calling " + tool + "."},
			map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", len(req.Messages)), "name": tool, "input": map[string]any{"expression": "6*7"}})
	default:
		answer("end_turn", map[string]any{"type": "text", "text": "hello from " + req.Model})
	}
}

// stream answers msg as the reference's stream of events. With failure,
// it sends the failure's error event after failure.AfterDeltas deltas
// instead of the rest.
func (f *FakeAnthropic) stream(ctx context.Context, w http.ResponseWriter, msg map[string]any, failure *AnthropicFailure) {
	w.Header().Set("request-id", "req_fake")
	s := f.streams.start(ctx, w)
	usage := msg["usage"].(map[string]any)
	start := map[string]any{}
	for k, v := range msg {
		start[k] = v
	}
	start["content"], start["stop_reason"] = []any{}, nil
	start["usage"] = map[string]any{"input_tokens": usage["input_tokens"], "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	s.event("message_start", map[string]any{"type": "message_start", "message": start})
	sendError := func() {
		typ := failure.Type
		if typ == "" {
			if typ = anthropicErrorTypes[failure.Status]; typ == "" {
				typ = "api_error"
			}
		}
		s.event("error", map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": failure.Message}})
	}
	failed := func() bool {
		if failure == nil || s.deltas < failure.AfterDeltas {
			return false
		}
		sendError()
		return true
	}
	if !s.begun() || failed() {
		return
	}
	for i, block := range msg["content"].([]map[string]any) {
		switch block["type"] {
		case "text":
			s.event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			if i == 0 {
				s.event("ping", map[string]any{"type": "ping"})
			}
			for _, p := range pieces(block["text"].(string), fakeDeltaRunes) {
				if !s.delta("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": p}}) || failed() {
					return
				}
			}
		case "tool_use":
			s.event("content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "tool_use", "id": block["id"], "name": block["name"], "input": map[string]any{}}})
			if i == 0 {
				s.event("ping", map[string]any{"type": "ping"})
			}
			input, _ := json.Marshal(block["input"])
			for _, p := range pieces(string(input), fakeDeltaRunes) {
				if !s.delta("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": p}}) || failed() {
					return
				}
			}
		}
		s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	if failure != nil { // fewer deltas than AfterDeltas
		sendError()
		return
	}
	if !s.end() {
		return
	}
	s.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": msg["stop_reason"], "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": usage["output_tokens"]}})
	s.event("message_stop", map[string]any{"type": "message_stop"})
}

// toolResultText is a tool_result's content as text: a string, or the
// text of its text blocks.
func toolResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []AnthropicBlock
	_ = json.Unmarshal(raw, &blocks)
	var parts []string
	for _, b := range blocks {
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "")
}

// answerError writes the reference's error shape: {"type": "error",
// "error": {"type", "message"}, "request_id"}.
func (f *FakeAnthropic) answerError(w http.ResponseWriter, a AnthropicFailure) {
	if a.Status == 0 {
		a.Status = http.StatusInternalServerError
	}
	typ := a.Type
	if typ == "" {
		if typ = anthropicErrorTypes[a.Status]; typ == "" {
			typ = "api_error"
		}
	}
	w.Header().Set("content-type", "application/json")
	w.Header().Set("request-id", "req_fake")
	if a.RetryAfter != "" {
		w.Header().Set("retry-after", a.RetryAfter)
	}
	w.WriteHeader(a.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": a.Message}, "request_id": "req_fake"})
}

// The API's patterns for tool names and tool_use IDs.
var (
	anthropicToolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)
	anthropicToolID   = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
)

// anthropicTopLevel are the request fields the reference lists.
var anthropicTopLevel = map[string]bool{
	"model": true, "messages": true, "max_tokens": true, "system": true, "tools": true, "tool_choice": true,
	"temperature": true, "top_p": true, "top_k": true, "stop_sequences": true, "metadata": true, "stream": true,
	"thinking": true, "output_config": true, "service_tier": true, "container": true, "mcp_servers": true,
}

// check reads and checks one request, returning what it read or the
// first rule it breaks.
func (f *FakeAnthropic) check(r *http.Request) (AnthropicRequest, error) {
	var req AnthropicRequest
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		return req, fmt.Errorf("%s %s: the Messages API is POST /v1/messages", r.Method, r.URL.Path)
	}
	if got := r.Header.Get("x-api-key"); got != f.apiKey {
		return req, fmt.Errorf("x-api-key is %q, want %q", got, f.apiKey)
	}
	if got := r.Header.Get("anthropic-version"); got != "2023-06-01" {
		return req, fmt.Errorf("anthropic-version is %q, want 2023-06-01", got)
	}
	if ct := r.Header.Get("content-type"); !strings.HasPrefix(ct, "application/json") {
		return req, fmt.Errorf("content-type is %q, want application/json", ct)
	}
	if r.Header.Get("authorization") != "" {
		return req, errors.New("an authorization header was sent: the API takes its key in x-api-key")
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return req, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return req, fmt.Errorf("the body is not a JSON object: %v", err)
	}
	for k := range top {
		if !anthropicTopLevel[k] {
			return req, fmt.Errorf("%s: Extra inputs are not permitted", k)
		}
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, fmt.Errorf("the body does not decode: %v", err)
	}
	req.Body = body
	if req.Model == "" {
		return req, errors.New("model: Field required")
	}
	var maxTokens json.Number
	d := json.NewDecoder(bytes.NewReader(top["max_tokens"]))
	d.UseNumber()
	if d.Decode(&maxTokens) != nil {
		return req, errors.New("max_tokens: Field required (an integer)")
	}
	if n, err := maxTokens.Int64(); err != nil || n < 1 {
		return req, fmt.Errorf("max_tokens: %s is not an integer of 1 or more", maxTokens)
	}
	if sys, ok := top["system"]; ok {
		var s string
		var blocks []AnthropicBlock
		if json.Unmarshal(sys, &s) != nil {
			if json.Unmarshal(sys, &blocks) != nil {
				return req, errors.New("system: want a string or a list of text blocks")
			}
			for i, b := range blocks {
				if b.Type != "text" || b.Text == "" {
					return req, fmt.Errorf("system.%d: want a text block with text", i)
				}
			}
		}
	}
	if t := req.Temperature; t != nil && (*t < 0 || *t > 1) {
		return req, fmt.Errorf("temperature: %v is not between 0 and 1", *t)
	}
	tools := map[string]bool{}
	var rawTools []map[string]json.RawMessage
	if raw, ok := top["tools"]; ok && json.Unmarshal(raw, &rawTools) != nil {
		return req, errors.New("tools: want a list of tools")
	}
	for i, t := range rawTools {
		for k := range t {
			switch k {
			case "name", "description", "input_schema", "cache_control", "strict", "type":
			default:
				return req, fmt.Errorf("tools.%d.%s: Extra inputs are not permitted", i, k)
			}
		}
		tool := req.Tools[i]
		if !anthropicToolName.MatchString(tool.Name) || tools[tool.Name] {
			return req, fmt.Errorf("tools.%d.name: %q is not a valid, unique tool name", i, tool.Name)
		}
		tools[tool.Name] = true
		var schema map[string]any
		if json.Unmarshal(tool.InputSchema, &schema) != nil || schema == nil || schema["type"] != "object" {
			return req, fmt.Errorf("tools.%d.input_schema: want a JSON Schema object of type object, got %s", i, tool.InputSchema)
		}
	}
	if raw, ok := top["tool_choice"]; ok {
		if len(tools) == 0 {
			return req, errors.New("tool_choice: may only be specified while providing tools")
		}
		switch req.ToolChoice["type"] {
		case "auto", "any", "none":
		case "tool":
			if name, _ := req.ToolChoice["name"].(string); !tools[name] {
				return req, fmt.Errorf("tool_choice.name: %q is not among the tools", name)
			}
		default:
			return req, fmt.Errorf("tool_choice: %s: type must be auto, any, tool or none", raw)
		}
	}
	return req, f.checkMessages(top["messages"], &req)
}

// checkMessages checks the turns and fills req.Messages' blocks.
func (f *FakeAnthropic) checkMessages(raw json.RawMessage, req *AnthropicRequest) error {
	var msgs []map[string]json.RawMessage
	if json.Unmarshal(raw, &msgs) != nil || len(msgs) == 0 {
		return errors.New("messages: want a non-empty list of messages")
	}
	var pending map[string]bool // tool_use IDs of the turn before, unanswered
	seenIDs := map[string]bool{}
	for i, m := range msgs {
		p := fmt.Sprintf("messages.%d", i)
		for k := range m {
			if k != "role" && k != "content" {
				return fmt.Errorf("%s.%s: Extra inputs are not permitted", p, k)
			}
		}
		role := req.Messages[i].Role
		switch {
		case role != "user" && role != "assistant":
			return fmt.Errorf("%s.role: %q is not user or assistant", p, role)
		case i == 0 && role != "user":
			return fmt.Errorf("%s: the first message must use the user role", p)
		case i > 0 && role == req.Messages[i-1].Role:
			return fmt.Errorf("%s: roles must alternate between user and assistant; two %s turns in a row", p, role)
		}
		var blocks []AnthropicBlock
		var s string
		if json.Unmarshal(m["content"], &s) == nil {
			if s == "" {
				return fmt.Errorf("%s.content: text content must be non-empty", p)
			}
			blocks = []AnthropicBlock{{Type: "text", Text: s}}
		} else if json.Unmarshal(m["content"], &blocks) != nil || len(blocks) == 0 {
			return fmt.Errorf("%s.content: want a non-empty string or list of content blocks", p)
		}
		answered := map[string]bool{}
		seenOther := false
		var calls map[string]bool
		for j, b := range blocks {
			bp := fmt.Sprintf("%s.content.%d", p, j)
			switch b.Type {
			case "text":
				if b.Text == "" {
					return fmt.Errorf("%s: text content blocks must be non-empty", bp)
				}
				seenOther = true
			case "tool_use":
				if role != "assistant" {
					return fmt.Errorf("%s: tool_use blocks belong to assistant turns", bp)
				}
				if !anthropicToolID.MatchString(b.ID) || seenIDs[b.ID] {
					return fmt.Errorf("%s.id: %q is not a valid, unique tool_use ID (letters, digits, _ and -)", bp, b.ID)
				}
				seenIDs[b.ID] = true
				var input map[string]any
				if b.Name == "" || json.Unmarshal(b.Input, &input) != nil || input == nil {
					return fmt.Errorf("%s: a tool_use needs a name and an object input", bp)
				}
				if calls == nil {
					calls = map[string]bool{}
				}
				calls[b.ID] = true
			case "tool_result":
				if role != "user" {
					return fmt.Errorf("%s: tool_result blocks belong to user turns", bp)
				}
				if seenOther {
					return fmt.Errorf("%s: tool_result blocks must come first in the user turn, before any other content", bp)
				}
				if !pending[b.ToolUseID] || answered[b.ToolUseID] {
					return fmt.Errorf("%s: unexpected tool_use_id %q: each tool_result must answer one tool_use block of the previous message", bp, b.ToolUseID)
				}
				answered[b.ToolUseID] = true
				if len(b.Content) > 0 {
					var cs string
					var cb []AnthropicBlock
					if json.Unmarshal(b.Content, &cs) != nil && json.Unmarshal(b.Content, &cb) != nil {
						return fmt.Errorf("%s.content: want a string or a list of content blocks", bp)
					}
				}
			default:
				return fmt.Errorf("%s: block type %q is not one this fake takes", bp, b.Type)
			}
		}
		for id := range pending {
			if !answered[id] {
				return fmt.Errorf("%s: tool_use ids were found without tool_result blocks immediately after: %s", p, id)
			}
		}
		pending = calls
		req.Messages[i].Content = blocks
	}
	if len(pending) > 0 {
		return errors.New("messages: the last turn calls tools; their results must follow in a user turn")
	}
	return nil
}
