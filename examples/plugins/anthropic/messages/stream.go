package messages

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/examples/plugins/internal/sse"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Call carries out a model request on h: it sends it, streamed unless
// the config's Stream is off, and returns the effect's reply.
func Call(h modelcall.Host, c Config, req abi.ModelRequest) abi.EffectReply {
	httpReq, err := HTTPRequest(c, req)
	if err != nil {
		return abi.Failed("anthropic: cannot encode the request: "+err.Error(), false)
	}
	return modelcall.Call(h, API, httpReq, c.Stream)
}

// API is the Messages API for modelcall.Call: Decode for whole responses
// and NewStream for streamed ones.
var API = modelcall.API{
	Name:      "anthropic",
	Decode:    Decode,
	NewAnswer: func() modelcall.Answer { return NewStream() },
}

// StreamEvent is the data of an event of a streamed message (its type is
// also the SSE event's name):
//
//   - message_start: the message, with no content yet, and its usage so
//     far (the input tokens);
//   - content_block_start (index, content_block: a text block, or a
//     tool_use with its id and name), content_block_delta (index, delta:
//     text_delta's text, or input_json_delta's partial_json, a piece of
//     the tool's input as JSON text), content_block_stop;
//   - message_delta: delta.stop_reason, and the usage so far (the output
//     tokens, counted to the end);
//   - message_stop, the end; ping, which says nothing;
//   - error: the error body's error, when the server fails mid-stream.
type StreamEvent struct {
	Type    string `json:"type"`
	Message struct {
		Usage Usage `json:"usage"`
	} `json:"message"`
	Index        int           `json:"index"`
	ContentBlock ResponseBlock `json:"content_block"`
	Delta        struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Usage struct {
		InputTokens              *int64 `json:"input_tokens"`
		OutputTokens             *int64 `json:"output_tokens"`
		CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
		CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
	} `json:"usage"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id"`
}

// Stream assembles a streamed message, event by event, into the reply
// its whole response would decode to (Decode). It is a modelcall.Answer.
type Stream struct {
	started  bool           // message_start came
	blocks   []*streamBlock // in the order they started
	byIndex  map[int]int    // a block's index in the stream → its place in blocks
	calls    int            // tool_use blocks so far
	stop     string
	usage    Usage
	stopped  bool // message_stop
	failed   *abi.EffectReply
	finished bool // a stop reason came
}

// streamBlock is a content block being assembled.
type streamBlock struct {
	block ResponseBlock
	call  int // its place among the message's tool calls, for a tool_use
	text  strings.Builder
	input strings.Builder // a tool_use's input, from its input_json_delta pieces
}

// NewStream returns a Stream at the start of a message.
func NewStream() *Stream { return &Stream{byIndex: map[int]int{}} }

// Event reads one event of the stream, and returns the pieces of the
// answer it carries: text, and pieces of tool calls, each numbered by
// its place among the message's tool calls (not among its blocks).
func (s *Stream) Event(ev sse.Event) abi.ModelDelta {
	if s.Over() {
		return abi.ModelDelta{}
	}
	var e StreamEvent
	err := json.Unmarshal([]byte(ev.Data), &e)
	typ := e.Type
	if typ == "" {
		typ = ev.Type
	}
	switch {
	case typ == "error":
		s.fail(streamError(e, ev.Data))
		return abi.ModelDelta{}
	case err != nil:
		s.fail(abi.Failed("anthropic: an event of the answer's stream is not JSON: "+err.Error()+": "+clip(ev.Data), false))
		return abi.ModelDelta{}
	}
	switch typ {
	case "message_start":
		s.started = true
		s.usage = e.Message.Usage
	case "content_block_start":
		b := &streamBlock{block: e.ContentBlock}
		s.byIndex[e.Index] = len(s.blocks)
		s.blocks = append(s.blocks, b)
		switch b.block.Type {
		case blockText:
			b.text.WriteString(b.block.Text)
			return abi.ModelDelta{Text: b.block.Text}
		case blockToolUse:
			b.call = s.calls
			s.calls++
			return abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{{Index: b.call, ID: b.block.ID, Name: b.block.Name}}}
		}
	case "content_block_delta":
		i, ok := s.byIndex[e.Index]
		if !ok {
			s.fail(abi.Failed("anthropic: the answer's stream has a content_block_delta for block "+strconv.Itoa(e.Index)+", which it never started", false))
			return abi.ModelDelta{}
		}
		b := s.blocks[i]
		switch {
		case e.Delta.Type == "text_delta" && b.block.Type == blockText:
			b.text.WriteString(e.Delta.Text)
			return abi.ModelDelta{Text: e.Delta.Text}
		case e.Delta.Type == "input_json_delta" && b.block.Type == blockToolUse:
			b.input.WriteString(e.Delta.PartialJSON)
			return abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{{Index: b.call, Arguments: e.Delta.PartialJSON}}}
		}
	case "message_delta":
		if e.Delta.StopReason != "" {
			s.stop, s.finished = e.Delta.StopReason, true
		}
		// The usage of message_delta counts to the end: it replaces what
		// message_start said, field by field.
		set := func(into *int64, v *int64) {
			if v != nil {
				*into = *v
			}
		}
		set(&s.usage.InputTokens, e.Usage.InputTokens)
		set(&s.usage.OutputTokens, e.Usage.OutputTokens)
		set(&s.usage.CacheCreationInputTokens, e.Usage.CacheCreationInputTokens)
		set(&s.usage.CacheReadInputTokens, e.Usage.CacheReadInputTokens)
	case "message_stop":
		s.stopped = true
	}
	return abi.ModelDelta{}
}

func (s *Stream) fail(r abi.EffectReply) { s.failed = &r }

// Over reports whether the stream said it is over: message_stop, or an
// error.
func (s *Stream) Over() bool { return s.stopped || s.failed != nil }

// Finished reports whether the message's stop reason came.
func (s *Stream) Finished() bool { return s.finished }

// Reply is the reply for the message read: what Decode makes of the
// whole message with its blocks, stop reason and usage, or the failure
// the stream reported.
func (s *Stream) Reply() abi.EffectReply {
	if s.failed != nil {
		return *s.failed
	}
	if !s.started {
		return abi.Failed("anthropic: the answer's stream has no message_start", false)
	}
	r := Response{Type: "message", Role: roleAssistant, StopReason: s.stop, Usage: s.usage}
	for _, b := range s.blocks {
		block := b.block
		switch block.Type {
		case blockText:
			block.Text = b.text.String()
		case blockToolUse:
			if b.input.Len() > 0 {
				block.Input = json.RawMessage(b.input.String())
			}
		}
		r.Content = append(r.Content, block)
	}
	return reply(r)
}

// streamError is the reply for an error event: the server failed after
// it answered 200. It is read as an error body of that type would be
// (errorReply): overloaded_error and rate_limit_error are rate_limited,
// api_error retriable, and so on.
func streamError(e StreamEvent, data string) abi.EffectReply {
	what := ErrorBody{Error: e.Error, RequestID: e.RequestID}.describe()
	if what == "" {
		what = clip(data)
	}
	return errorReply("anthropic: the server reported an error in the answer's stream: "+what, 0, e.Error.Type, 0)
}
