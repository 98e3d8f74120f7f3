package chat

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/agenthost/agenthost/examples/plugins/internal/modelcall"
	"github.com/agenthost/agenthost/examples/plugins/internal/sse"
	"github.com/agenthost/agenthost/plugins/abi"
)

// Call carries out a model request on h: it sends it, streamed unless
// the config's Stream is off, and returns the effect's reply.
func Call(h modelcall.Host, c Config, req abi.ModelRequest) abi.EffectReply {
	httpReq, err := HTTPRequest(c, req)
	if err != nil {
		return abi.Failed("openai: cannot encode the request: "+err.Error(), false)
	}
	return modelcall.Call(h, API(h), httpReq, c.Stream)
}

// API is chat completions for modelcall.Call: Decode for whole responses,
// with h's clock, and NewStream for streamed ones.
func API(h modelcall.Host) modelcall.API {
	return modelcall.API{
		Name:      "openai",
		Decode:    func(resp abi.HTTPResponse) abi.EffectReply { return Decode(resp, time.UnixMilli(h.NowMS())) },
		NewAnswer: func() modelcall.Answer { return NewStream() },
	}
}

// Chunk is one event of a streamed chat completion: the pieces of its
// choices' messages, a choice's finish reason in its last piece, and, in
// the last chunk (stream_options.include_usage), the usage and no
// choices. A server that fails mid-stream sends an error instead.
type Chunk struct {
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Content   *string         `json:"content"`
			ToolCalls []ToolCallChunk `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *Usage          `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// ToolCallChunk is a piece of a tool call: Index says which call; the
// first piece has its ID, type and name; the arguments' JSON text comes
// in pieces to concatenate.
type ToolCallChunk struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Stream assembles a streamed chat completion, chunk by chunk, into the
// reply its whole response would decode to (Decode). It is a
// modelcall.Answer.
type Stream struct {
	content  strings.Builder
	chosen   bool        // a chunk of choice 0 came
	calls    []*toolCall // in the order of their first piece
	byIndex  map[int]int // a call's index in the stream → its place in calls
	finish   string
	usage    Usage
	done     bool // [DONE]
	failed   *abi.EffectReply
	finished bool // a finish reason came
}

// toolCall is a tool call being assembled.
type toolCall struct {
	id, name string
	args     strings.Builder
}

// NewStream returns a Stream at the start of an answer.
func NewStream() *Stream { return &Stream{byIndex: map[int]int{}} }

// Event reads one event of the stream: a chunk, [DONE], or an error. It
// returns the pieces of the answer the chunk carries: the text of choice
// 0 and the pieces of its tool calls, each call numbered by its place
// among the answer's calls.
func (s *Stream) Event(ev sse.Event) abi.ModelDelta {
	if s.Over() {
		return abi.ModelDelta{}
	}
	data := strings.TrimSpace(ev.Data)
	if data == "[DONE]" {
		s.done = true
		return abi.ModelDelta{}
	}
	var c Chunk
	err := json.Unmarshal([]byte(data), &c)
	switch {
	case ev.Type == "error" || err == nil && len(c.Error) > 0 && string(c.Error) != "null":
		s.fail(streamError(data))
		return abi.ModelDelta{}
	case err != nil:
		s.fail(abi.Failed("openai: an event of the answer's stream is not a chat completion chunk: "+err.Error()+": "+clip(data), false))
		return abi.ModelDelta{}
	}
	if c.Usage != nil {
		s.usage = *c.Usage
	}
	var d abi.ModelDelta
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		s.chosen = true
		if ch.Delta.Content != nil {
			s.content.WriteString(*ch.Delta.Content)
			d.Text += *ch.Delta.Content
		}
		for _, tc := range ch.Delta.ToolCalls {
			modelcall.Merge(&d, abi.ModelDelta{ToolCalls: []abi.ToolCallDelta{s.addPiece(tc)}})
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.finish, s.finished = *ch.FinishReason, true
		}
	}
	return d
}

// addPiece adds a piece to its tool call and returns it as a delta: the
// call's ID and name when this piece is the first to carry them. A piece
// without an index belongs to the last call, or starts one when it has
// an ID the last call does not.
func (s *Stream) addPiece(tc ToolCallChunk) abi.ToolCallDelta {
	at := -1
	switch {
	case tc.Index != nil:
		if i, ok := s.byIndex[*tc.Index]; ok {
			at = i
		}
	case len(s.calls) > 0 && (tc.ID == "" || tc.ID == s.calls[len(s.calls)-1].id):
		at = len(s.calls) - 1
	}
	if at < 0 {
		at = len(s.calls)
		s.calls = append(s.calls, &toolCall{})
		if tc.Index != nil {
			s.byIndex[*tc.Index] = at
		}
	}
	call := s.calls[at]
	d := abi.ToolCallDelta{Index: at, Arguments: tc.Function.Arguments}
	if call.id == "" && tc.ID != "" {
		call.id, d.ID = tc.ID, tc.ID
	}
	if call.name == "" && tc.Function.Name != "" {
		call.name, d.Name = tc.Function.Name, tc.Function.Name
	}
	call.args.WriteString(tc.Function.Arguments)
	return d
}

func (s *Stream) fail(r abi.EffectReply) { s.failed = &r }

// Over reports whether the stream said it is over: [DONE], or an error.
func (s *Stream) Over() bool { return s.done || s.failed != nil }

// Finished reports whether choice 0's finish reason came.
func (s *Stream) Finished() bool { return s.finished }

// Reply is the reply for the answer read: what Decode makes of the
// response that has its choice 0 and usage, or the failure the stream
// reported.
func (s *Stream) Reply() abi.EffectReply {
	if s.failed != nil {
		return *s.failed
	}
	if !s.chosen {
		return abi.Failed("openai: the answer's stream has no choices", false)
	}
	content := s.content.String()
	m := Message{Role: abi.MessageAssistant, Content: &content}
	for _, c := range s.calls {
		m.ToolCalls = append(m.ToolCalls, ToolCall{ID: c.id, Type: "function", Function: FunctionCall{Name: c.name, Arguments: c.args.String()}})
	}
	return reply(Response{Choices: []Choice{{Message: m, FinishReason: s.finish}}, Usage: s.usage})
}

// streamError is the reply for an error a server sent in the stream,
// after it answered 200: retriable (the next attempt starts over), as
// rate_limited when it says it is a rate limit, and not retriable when
// the account's quota is used up.
func streamError(data string) abi.EffectReply {
	msg := "openai: the server reported an error in the answer's stream: " + serverMessage(data)
	var e struct {
		Error struct {
			Code json.RawMessage `json:"code"`
			Type string          `json:"type"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(data), &e)
	var code string
	_ = json.Unmarshal(e.Error.Code, &code)
	switch {
	case quotaExhausted(data):
		return abi.Failed(msg+" (the account's quota is used up: retrying does not help)", false)
	case code == "rate_limit_exceeded" || e.Error.Type == "rate_limit_exceeded":
		return abi.RateLimited(msg, 0)
	}
	return abi.Failed(msg, true)
}
