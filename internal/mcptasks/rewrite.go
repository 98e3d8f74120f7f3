package mcptasks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxMessageBytes bounds one JSON-RPC message a server sends through
// RoundTripper: the body of a JSON answer, or the data of one event of a
// stream. Past it the read fails, and so does the request it answers.
const MaxMessageBytes = 4 << 20

// maxTracked bounds the requests a rewriter remembers while their answers
// are due; past it the oldest are forgotten (their answers then pass
// unchanged).
const maxTracked = 4096

// rewriter moves the fields of tasks through the SDK (package doc): it
// remembers the method of each request it sees go out, by its session and
// ID, so that it knows what the answer coming in answers. (Over HTTP the
// session is the Mcp-Session-Id the request carried: the answer comes on
// that request's response, or on a stream resumed with the same header.)
type rewriter struct {
	mu      sync.Mutex
	methods map[string]string // session + "\x00" + ID → method
	order   []string          // the keys of methods, oldest first
}

func newRewriter() *rewriter { return &rewriter{methods: map[string]string{}} }

func idKey(session string, id jsonrpc.ID) string {
	return fmt.Sprintf("%s\x00%T:%v", session, id.Raw(), id.Raw())
}

// out rewrites a message on its way to the server: a tools/call that
// carries the private request marker becomes a task-augmented one. It
// remembers every request's method.
func (r *rewriter) out(session string, msg jsonrpc.Message) jsonrpc.Message {
	req, ok := msg.(*jsonrpc.Request)
	if !ok || !req.ID.IsValid() {
		return msg
	}
	r.track(idKey(session, req.ID), req.Method)
	if req.Method != "tools/call" {
		return msg
	}
	params, ok := object(req.Params)
	if !ok {
		return msg
	}
	meta, ok := object(params["_meta"])
	if !ok {
		return msg
	}
	task, ok := meta[metaRequestTask]
	if !ok {
		return msg
	}
	delete(meta, metaRequestTask)
	params["task"] = task
	if len(meta) == 0 {
		delete(params, "_meta")
	} else {
		params["_meta"] = mustJSON(meta)
	}
	out := *req
	out.Params = mustJSON(params)
	return &out
}

// in rewrites a message on its way from the server: the answer to an
// initialize, a tools/list or a tools/call, by what it answers.
func (r *rewriter) in(session string, msg jsonrpc.Message) jsonrpc.Message {
	resp, ok := msg.(*jsonrpc.Response)
	if !ok || !resp.ID.IsValid() || resp.Error != nil {
		if ok && resp.ID.IsValid() {
			r.forget(idKey(session, resp.ID))
		}
		return msg
	}
	method := r.forget(idKey(session, resp.ID))
	var result []byte
	switch method {
	case "initialize":
		result = liftInitialize(resp.Result)
	case "tools/list":
		result = liftTools(resp.Result)
	case "tools/call":
		result = liftCreatedTask(resp.Result)
	}
	if result == nil {
		return msg
	}
	out := *resp
	out.Result = result
	return &out
}

func (r *rewriter) track(key, method string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.methods[key]; !ok {
		r.order = append(r.order, key)
	}
	r.methods[key] = method
	for len(r.order) > maxTracked {
		delete(r.methods, r.order[0])
		r.order = r.order[1:]
	}
}

// forget returns the method of the request of key, and forgets it.
func (r *rewriter) forget(key string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.methods[key]
	if !ok {
		return ""
	}
	delete(r.methods, key)
	for i, k := range r.order {
		if k == key {
			r.order = append(r.order[:i], r.order[i+1:]...)
			break
		}
	}
	return m
}

// liftInitialize moves an initialize result's capabilities.tasks into its
// _meta; nil when there is none.
func liftInitialize(raw json.RawMessage) []byte {
	res, ok := object(raw)
	if !ok {
		return nil
	}
	caps, ok := object(res["capabilities"])
	if !ok || caps["tasks"] == nil {
		return nil
	}
	return withMeta(res, metaServerTasks, caps["tasks"])
}

// liftTools moves each tool's execution into its _meta; nil when no tool
// has one.
func liftTools(raw json.RawMessage) []byte {
	res, ok := object(raw)
	if !ok {
		return nil
	}
	var tools []json.RawMessage
	if json.Unmarshal(res["tools"], &tools) != nil {
		return nil
	}
	changed := false
	for i, t := range tools {
		tool, ok := object(t)
		if !ok || tool["execution"] == nil {
			continue
		}
		if lifted := withMeta(tool, metaExecution, tool["execution"]); lifted != nil {
			tools[i], changed = lifted, true
		}
	}
	if !changed {
		return nil
	}
	res["tools"] = mustJSON(tools)
	return mustJSON(res)
}

// liftCreatedTask turns a CreateTaskResult into a CallToolResult without
// content whose _meta holds the task; nil for any other result.
func liftCreatedTask(raw json.RawMessage) []byte {
	res, ok := object(raw)
	if !ok || res["task"] == nil || res["content"] != nil {
		return nil
	}
	if _, ok := object(res["task"]); !ok {
		return nil
	}
	out := map[string]json.RawMessage{"content": json.RawMessage(`[]`)}
	if res["_meta"] != nil {
		out["_meta"] = res["_meta"]
	}
	return withMeta(out, metaCreatedTask, res["task"])
}

// withMeta returns obj with _meta[key] set to v, or nil when obj's _meta
// is not an object.
func withMeta(obj map[string]json.RawMessage, key string, v json.RawMessage) []byte {
	meta := map[string]json.RawMessage{}
	if obj["_meta"] != nil {
		m, ok := object(obj["_meta"])
		if !ok {
			return nil
		}
		meta = m
	}
	meta[key] = v
	obj["_meta"] = mustJSON(meta)
	return mustJSON(obj)
}

// object decodes a JSON object, keeping its values as they are.
func object(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return nil, false
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return nil, false
	}
	return m, true
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // raw JSON values and maps of them always marshal
	}
	return b
}

// WrapTransport returns t with the rewrites of this package on its
// messages, for a transport whose connections the SDK needs nothing of
// beyond mcp.Connection: stdio (mcp.CommandTransport, mcp.IOTransport).
// The streamable HTTP transport is not one (its connection learns of the
// session from the SDK); give it RoundTripper instead.
func WrapTransport(t mcp.Transport) mcp.Transport {
	return &wrappedTransport{inner: t, rw: newRewriter()}
}

type wrappedTransport struct {
	inner mcp.Transport
	rw    *rewriter
}

func (t *wrappedTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &wrappedConn{Connection: c, rw: t.rw}, nil
}

type wrappedConn struct {
	mcp.Connection
	rw *rewriter
}

func (c *wrappedConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		return nil, err
	}
	return c.rw.in("", msg), nil
}

func (c *wrappedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	return c.Connection.Write(ctx, c.rw.out("", msg))
}

// RoundTripper returns next with the rewrites of this package on the
// messages of MCP's streamable HTTP transport: the JSON-RPC message of a
// request's body, and the answer's, whether one JSON message or a stream
// of events (each event's data bounded by MaxMessageBytes). Give the
// streamable client transport an http.Client over it.
func RoundTripper(next http.RoundTripper) http.RoundTripper {
	return &roundTripper{next: next, rw: newRewriter()}
}

type roundTripper struct {
	next http.RoundTripper
	rw   *rewriter
}

func (t *roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	session := req.Header.Get("Mcp-Session-Id")
	if req.Method == http.MethodPost && req.Body != nil {
		body, err := io.ReadAll(io.LimitReader(req.Body, MaxMessageBytes+1))
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		if msg, derr := jsonrpc.DecodeMessage(body); derr == nil && len(body) <= MaxMessageBytes {
			if out := t.rw.out(session, msg); out != msg {
				if b, err := jsonrpc.EncodeMessage(out); err == nil {
					body = b
				}
			}
		}
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode/100 != 2 || resp.Body == nil {
		return resp, err
	}
	switch mediaType(resp.Header.Get("Content-Type")) {
	case "application/json":
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxMessageBytes+1))
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if len(body) > MaxMessageBytes {
			return nil, fmt.Errorf("mcptasks: the server's answer is over %d bytes", MaxMessageBytes)
		}
		if msg, derr := jsonrpc.DecodeMessage(body); derr == nil {
			if out := t.rw.in(session, msg); out != msg {
				if b, err := jsonrpc.EncodeMessage(out); err == nil {
					body = b
				}
			}
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Del("Content-Length")
	case "text/event-stream":
		resp.Body = &eventRewriter{src: bufio.NewReaderSize(resp.Body, 64<<10), body: resp.Body, rw: t.rw, session: session}
	}
	return resp, nil
}

func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// errEventTooLarge ends a stream whose event's data is over
// MaxMessageBytes.
var errEventTooLarge = fmt.Errorf("mcptasks: an event of the server's stream is over %d bytes", MaxMessageBytes)

// eventRewriter rewrites the messages of a stream of server-sent events,
// one event at a time: its data lines, joined, are one JSON-RPC message;
// every other line passes as it is.
type eventRewriter struct {
	src     *bufio.Reader
	body    io.Closer
	rw      *rewriter
	session string
	out     bytes.Buffer
	err     error
}

func (e *eventRewriter) Read(p []byte) (int, error) {
	for e.out.Len() == 0 && e.err == nil {
		e.err = e.next()
	}
	if e.out.Len() > 0 {
		return e.out.Read(p)
	}
	return 0, e.err
}

func (e *eventRewriter) Close() error { return e.body.Close() }

// next reads one event (up to its blank line, or the end of the stream)
// into out, rewritten.
func (e *eventRewriter) next() error {
	var other [][]byte // lines other than data, in order
	var data [][]byte
	size := 0
	for {
		line, err := e.readLine()
		if err != nil && len(line) == 0 {
			e.flush(other, data)
			return err
		}
		trimmed := bytes.TrimRight(line, "\r\n")
		if len(trimmed) == 0 {
			e.flush(other, data)
			e.out.WriteString("\n")
			return nil
		}
		if d, ok := bytes.CutPrefix(trimmed, []byte("data:")); ok {
			d = bytes.TrimPrefix(d, []byte(" "))
			size += len(d)
			if size > MaxMessageBytes {
				return errEventTooLarge
			}
			data = append(data, bytes.Clone(d))
		} else {
			other = append(other, bytes.Clone(trimmed))
		}
		if err != nil {
			e.flush(other, data)
			return err
		}
	}
}

// readLine reads one line, refusing one longer than an event may be.
func (e *eventRewriter) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := e.src.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxMessageBytes+64 {
			return nil, errEventTooLarge
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return line, err
	}
}

// flush writes one event's lines to out, its data rewritten when it is a
// message the rewriter changes.
func (e *eventRewriter) flush(other, data [][]byte) {
	for _, l := range other {
		e.out.Write(l)
		e.out.WriteString("\n")
	}
	if len(data) == 0 {
		return
	}
	joined := bytes.Join(data, []byte("\n"))
	if msg, err := jsonrpc.DecodeMessage(joined); err == nil {
		if out := e.rw.in(e.session, msg); out != msg {
			if b, err := jsonrpc.EncodeMessage(out); err == nil {
				e.out.WriteString("data: ")
				e.out.Write(b)
				e.out.WriteString("\n")
				return
			}
		}
	}
	for _, d := range data {
		e.out.WriteString("data: ")
		e.out.Write(d)
		e.out.WriteString("\n")
	}
}
