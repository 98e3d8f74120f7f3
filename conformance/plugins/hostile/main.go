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
	"file_read", "http", "kv_put", "kv_read", "ok"}

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
