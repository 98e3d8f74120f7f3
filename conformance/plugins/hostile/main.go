//go:build wasip1

// Command hostile is the one misbehaving conformance executor. The tool
// name of a start call picks the misbehaviour:
//
//	loop         spins forever (only the call timeout stops it)
//	oom          allocates more memory than any cap allows
//	trap         panics
//	huge_output  replies with 2 MiB of output
//	not_json     replies with bytes that are not JSON
//	bad_schema   replies with JSON whose state is not an ABI state
//	nonzero      returns a non-zero status with error_set
//	file_read    reads the file named by argument path (default /etc/passwd)
//	http         fetches argument url through agenthost_http
//	http_stream  reads argument url's body as it arrives, through
//	             agenthost_http_open, _read and _close (streamArgs)
//	kv_put       writes argument value under argument key
//	kv_read      reads argument key, then tries to reach other tenants'
//	             copies of it with crafted keys
//	ok           behaves: done with content "ok"
//
// A refused file read or HTTP request is answered failed, with the
// refusal as the message; a successful one answers done with what it got,
// so a test can tell a leak from a refusal. It exports the markers of ABI
// v1 and v2, so the host must pick v1, the highest it supports.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/agenthost/agenthost/conformance/plugins/internal/kit"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/extism/go-pdk"
)

func main() {}

//go:wasmexport agenthost_abi_v1
func markerV1() {}

//go:wasmexport agenthost_abi_v2
func markerV2() {}

var tools = []string{"loop", "oom", "trap", "huge_output", "not_json", "bad_schema", "nonzero",
	"file_read", "http", "http_stream", "kv_put", "kv_read", "ok"}

//go:wasmexport describe
func describe() int32 {
	d := abi.Describe{Name: "conformance-hostile", Version: "1.0.0", Role: abi.RoleExecutor,
		Effects: []abi.EffectKind{abi.KindTool}}
	for _, t := range tools {
		d.Tools = append(d.Tools, abi.Tool{Name: t, InputSchema: json.RawMessage(`{"type":"object"}`), Approval: abi.ApprovalNever})
	}
	return kit.Describe(d)
}

var sink [][]byte

//go:noinline
func spin(n *int) {
	for {
		*n++
	}
}

//go:wasmexport start
func start() int32 {
	var in abi.EffectInput
	if err := kit.Input(&in); err != nil {
		return kit.Fail("start: bad input: " + err.Error())
	}
	var req abi.ToolRequest
	_ = json.Unmarshal(in.Effect.Request, &req)
	var args struct {
		Path  string `json:"path"`
		URL   string `json:"url"`
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	_ = json.Unmarshal(req.Arguments, &args)

	switch in.Effect.Tool {
	case "loop":
		n := 0
		spin(&n)
		return kit.Done(fmt.Sprint(n))
	case "oom":
		// One allocation past any memory cap a test sets: growing the
		// heap a MiB at a time takes a collection a step, too slow
		// under -race on a loaded machine to beat the call timeout.
		for {
			sink = append(sink, make([]byte, 1<<30))
		}
	case "trap":
		var m map[string]int
		m["boom"] = 1 // a write to a nil map panics
		return kit.Done("unreachable")
	case "huge_output":
		pdk.OutputString(`{"state":"done","outcome":{"content":"` + strings.Repeat("x", 2<<20) + `"}}`)
		return 0
	case "not_json":
		pdk.OutputString("this is not JSON")
		return 0
	case "bad_schema":
		pdk.OutputString(`{"state":"exploded"}`)
		return 0
	case "nonzero":
		return kit.Fail("hostile: refusing on purpose")
	case "file_read":
		if args.Path == "" {
			args.Path = "/etc/passwd"
		}
		b, err := os.ReadFile(args.Path)
		if err != nil {
			return kit.Failed("file_read: "+err.Error(), false)
		}
		return kit.Done(string(b))
	case "http":
		resp := kit.HTTP(abi.HTTPRequest{Method: "GET", URL: args.URL, TimeoutMS: 5000})
		if resp.Error != nil {
			return kit.Failed("http: "+resp.Error.Code+": "+resp.Error.Message, false)
		}
		return kit.Done(fmt.Sprintf("%d %s", resp.Status, resp.Body))
	case "http_stream":
		var sa streamArgs
		_ = json.Unmarshal(req.Arguments, &sa)
		return httpStream(sa)
	case "kv_put":
		if st := kit.KVSet(args.Key, []byte(args.Value)); st != abi.StatusOK {
			return kit.Failed(fmt.Sprintf("kv_set: status %d", st), false)
		}
		return kit.Done("stored")
	case "kv_read":
		for _, k := range []string{args.Key, "../" + args.Key, "/" + args.Key, "\x00" + args.Key} {
			if v, ok := kit.KVGet(k); ok {
				return kit.Done(string(v))
			}
		}
		return kit.Failed("kv_read: not found", false)
	case "ok":
		return kit.Done("ok")
	}
	return kit.Failed(fmt.Sprintf("unknown tool %q", in.Effect.Tool), false)
}

//go:wasmexport poll
func poll() int32 { return kit.Reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport attach
func attach() int32 { return kit.Reply(abi.EffectReply{State: abi.StateUnknown}) }

//go:wasmexport cancel
func cancel() int32 { return kit.Reply(abi.CancelReply{State: abi.StateUnknown}) }

//go:wasmimport extism:host/user agenthost_http_open
func hostHTTPOpen(request uint64) uint64

//go:wasmimport extism:host/user agenthost_http_read
func hostHTTPRead(stream, limit uint64) uint64

//go:wasmimport extism:host/user agenthost_http_close
func hostHTTPClose(stream uint64) uint64

// streamArgs are the arguments of the http_stream tool.
type streamArgs struct {
	URL       string `json:"url"`
	TimeoutMS int64  `json:"timeout_ms"`
	Chunk     int64  `json:"chunk"`      // max of each read; 0 takes the host's cap
	Emit      bool   `json:"emit"`       // emit progress "read: CHUNK" after each read
	Opens     int    `json:"opens"`      // how many streams to open (default 1); the first is read
	Reads     int    `json:"reads"`      // close after this many reads (0: read to the end)
	LeaveOpen bool   `json:"leave_open"` // end the call without closing
	Spin      bool   `json:"spin"`       // then spin, the stream open, until the call timeout
	Stream    int64  `json:"stream"`     // read this stream number instead of opening one
	Then      string `json:"then"`       // a URL to fetch through agenthost_http after the close
	Count     bool   `json:"count"`      // keep only the number of bytes read, not the chunks
}

// streamResult is the http_stream tool's content.
type streamResult struct {
	Heads  []abi.HTTPStreamHead `json:"heads,omitempty"`
	Chunks []string             `json:"chunks"`
	Bytes  int                  `json:"bytes"`
	End    *abi.HTTPStreamEnd   `json:"end,omitempty"`
	Then   string               `json:"then,omitempty"`
}

// httpStream opens args.URL, reads its body a chunk at a time and
// replies done with what it read and how the close answered; a first
// open that fails answers failed, as the http tool does.
func httpStream(args streamArgs) int32 {
	var res streamResult
	stream := args.Stream
	if stream == 0 {
		for i := 0; i < max(args.Opens, 1); i++ {
			head := streamOpen(abi.HTTPRequest{Method: "GET", URL: args.URL, TimeoutMS: args.TimeoutMS})
			if i == 0 && head.Error != nil {
				return kit.Failed("http_stream: "+head.Error.Code+": "+head.Error.Message, false)
			}
			// Of the headers, only the content type: others, such as
			// Date, differ from one response to the next.
			if ct, ok := head.Headers["Content-Type"]; ok {
				head.Headers = map[string]string{"Content-Type": ct}
			}
			res.Heads = append(res.Heads, head)
		}
		stream = res.Heads[0].Stream
	}
	res.Chunks = []string{}
	for reads := 0; args.Reads == 0 || reads < args.Reads; reads++ {
		b, ok := streamRead(stream, args.Chunk)
		if !ok {
			break
		}
		res.Bytes += len(b)
		if !args.Count {
			res.Chunks = append(res.Chunks, string(b))
		}
		if args.Emit {
			kit.Emit("read: " + string(b))
		}
	}
	if args.Spin {
		n := 0
		spin(&n)
	}
	if args.LeaveOpen {
		return done(res)
	}
	end := streamClose(stream)
	res.End = &end
	for _, h := range res.Heads[min(1, len(res.Heads)):] {
		if h.Stream != 0 {
			streamClose(h.Stream)
		}
	}
	if args.Then != "" {
		resp := kit.HTTP(abi.HTTPRequest{Method: "GET", URL: args.Then, TimeoutMS: args.TimeoutMS})
		if resp.Error != nil {
			res.Then = resp.Error.Code + ": " + resp.Error.Message
		} else {
			res.Then = fmt.Sprintf("%d %s", resp.Status, resp.Body)
		}
	}
	return done(res)
}

func done(res streamResult) int32 {
	b, _ := json.Marshal(res)
	return kit.Done(string(b))
}

func streamOpen(req abi.HTTPRequest) abi.HTTPStreamHead {
	b, _ := json.Marshal(req)
	m := pdk.AllocateBytes(b)
	defer m.Free()
	var head abi.HTTPStreamHead
	if err := readJSON(hostHTTPOpen(m.Offset()), &head); err != nil {
		return abi.HTTPStreamHead{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: err.Error()}}
	}
	return head
}

func streamRead(stream, limit int64) ([]byte, bool) {
	off := hostHTTPRead(uint64(stream), uint64(limit))
	if off == 0 {
		return nil, false
	}
	m := pdk.FindMemory(off)
	defer m.Free()
	return m.ReadBytes(), true
}

func streamClose(stream int64) abi.HTTPStreamEnd {
	var end abi.HTTPStreamEnd
	if err := readJSON(hostHTTPClose(uint64(stream)), &end); err != nil {
		return abi.HTTPStreamEnd{Error: &abi.HTTPError{Code: abi.HTTPFailed, Message: err.Error()}}
	}
	return end
}

// readJSON decodes the host's JSON block at off into v, and frees it.
func readJSON(off uint64, v any) error {
	if off == 0 {
		return fmt.Errorf("no answer")
	}
	m := pdk.FindMemory(off)
	defer m.Free()
	return json.Unmarshal(m.ReadBytes(), v)
}
