package mcptasks

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The server side, for a server on the SDK that carries tools out as
// tasks. The SDK decodes a tools/call's params into its own type, which
// has no task: LiftHTTP moves it under the private _meta key first, and
// RequestedTask reads it there. What a server adds to its answers (the
// tasks capability, a tool's execution, a CreateTaskResult) it marshals
// itself, from a receiving middleware: the SDK sends whatever Result a
// method handler returns as it marshals.

// LiftHTTP returns h with the task of a task-augmented tools/call in the
// body of a POST moved to params._meta, where RequestedTask finds it. A
// body over MaxMessageBytes, or one that is not such a call, passes as it
// is (h bounds what it reads itself).
func LiftHTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxMessageBytes+1))
		r.Body.Close()
		if err == nil && len(body) <= MaxMessageBytes {
			body = LiftRequestTasks(body)
		}
		r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		r.ContentLength = -1
		if err == nil {
			r.ContentLength = int64(len(body))
		}
		h.ServeHTTP(w, r)
	})
}

// errReader ends a body with the error its reading met, if any.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// LiftRequestTasks moves the task of each task-augmented tools/call in
// body (one JSON-RPC message, or a batch of them) to its params._meta,
// where RequestedTask finds it, and returns the body; a body with no such
// call, or that is not JSON-RPC, is returned as it is, for the SDK to
// answer.
func LiftRequestTasks(body []byte) []byte {
	if !bytes.Contains(body, []byte(`"task"`)) {
		return body
	}
	var batch []json.RawMessage
	if json.Unmarshal(body, &batch) != nil {
		if lifted := liftRequestTask(body); lifted != nil {
			return lifted
		}
		return body
	}
	changed := false
	for i, m := range batch {
		if lifted := liftRequestTask(m); lifted != nil {
			batch[i], changed = lifted, true
		}
	}
	if !changed {
		return body
	}
	out, err := json.Marshal(batch)
	if err != nil {
		return body
	}
	return out
}

// liftRequestTask moves a tools/call request's params.task to
// params._meta; nil for any other message.
func liftRequestTask(body []byte) []byte {
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return nil
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok || req.Method != "tools/call" {
		return nil
	}
	params, ok := object(req.Params)
	if !ok || params["task"] == nil {
		return nil
	}
	meta := map[string]json.RawMessage{}
	if params["_meta"] != nil {
		if meta, ok = object(params["_meta"]); !ok {
			return nil
		}
	}
	meta[metaRequestTask] = params["task"]
	delete(params, "task")
	params["_meta"] = mustJSON(meta)
	out := *req
	out.Params = mustJSON(params)
	b, err := jsonrpc.EncodeMessage(&out)
	if err != nil {
		return nil
	}
	return b
}

// RequestedTask returns the task metadata of a task-augmented tools/call
// whose params came through LiftRequestTasks, and whether the call asked
// for a task. It takes the metadata out of params' _meta.
func RequestedTask(params *mcp.CallToolParamsRaw) (Metadata, bool) {
	if params == nil {
		return Metadata{}, false
	}
	if _, asked := params.Meta[metaRequestTask]; !asked {
		return Metadata{}, false
	}
	var md Metadata
	fromMeta(params.Meta, metaRequestTask, &md) // a malformed task asks for one all the same, with no TTL
	delete(params.Meta, metaRequestTask)
	return md, true
}
