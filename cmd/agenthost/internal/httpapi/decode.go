package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/agenthost/agenthost/plugins/abi"
)

// SubmitRequest is the body of POST /v1/sessions/{id}/runs.
type SubmitRequest struct {
	// Input is the user's input; required, not empty.
	Input string `json:"input"`
	// Metadata is stored with the Run as given; it must be a JSON object.
	Metadata json.RawMessage `json:"metadata,omitempty"`
}

// InputRequest is the body of POST /v1/runs/{id}/input: approvals of gated
// tool calls, or a message answering the Run's question. Exactly one of
// the two is set.
type InputRequest struct {
	Approvals []ApprovalRequest `json:"approvals,omitempty"`
	Message   *string           `json:"message,omitempty"`
}

// ApprovalRequest approves or denies one tool call. Approved is required:
// a missing field is an error, never a silent denial.
type ApprovalRequest struct {
	ToolCallID string `json:"tool_call_id"`
	Approved   *bool  `json:"approved"`
	Reason     string `json:"reason,omitempty"`
}

// CancelRequest is the optional body of POST /v1/runs/{id}/cancel.
type CancelRequest struct {
	Reason string `json:"reason,omitempty"`
}

// Decisions returns the approvals as the runtime takes them.
func (r InputRequest) Decisions() []abi.ApprovalDecision {
	out := make([]abi.ApprovalDecision, 0, len(r.Approvals))
	for _, a := range r.Approvals {
		out = append(out, abi.ApprovalDecision{ToolCallID: a.ToolCallID, Approved: *a.Approved, Reason: a.Reason})
	}
	return out
}

// maxApprovals bounds the approvals of one input request.
const maxApprovals = 256

// DecodeInputRequest reads and validates an input request body. Its errors
// are *apiError values with status 400 (or 413 when body was capped with
// http.MaxBytesReader and is over the cap) whose message says what is
// wrong and what to send instead.
func DecodeInputRequest(body io.Reader) (InputRequest, error) {
	var req InputRequest
	if err := decodeJSON(body, &req, "approvals, message"); err != nil {
		return InputRequest{}, err
	}
	switch {
	case req.Message != nil && len(req.Approvals) > 0:
		return InputRequest{}, badRequest(`send either "approvals" or "message", not both, in one request`)
	case req.Message != nil:
		if strings.TrimSpace(*req.Message) == "" {
			return InputRequest{}, badRequest(`"message" is empty; send the text that answers the Run's question`)
		}
		return req, nil
	case len(req.Approvals) == 0:
		return InputRequest{}, badRequest(`the body needs "approvals" ([{"tool_call_id": "...", "approved": true|false, "reason": "..."}]) or "message" ("...")`)
	case len(req.Approvals) > maxApprovals:
		return InputRequest{}, badRequest("%d approvals in one request; the limit is %d", len(req.Approvals), maxApprovals)
	}
	seen := map[string]bool{}
	for i, a := range req.Approvals {
		if a.ToolCallID == "" {
			return InputRequest{}, badRequest(`approvals[%d] has no "tool_call_id"; GET the Run to see the IDs under waiting.approvals`, i)
		}
		if a.Approved == nil {
			return InputRequest{}, badRequest(`approvals[%d] (tool call %q) has no "approved"; set it to true to approve or false to deny`, i, a.ToolCallID)
		}
		if seen[a.ToolCallID] {
			return InputRequest{}, badRequest("tool call %q appears twice in approvals; send one decision per tool call", a.ToolCallID)
		}
		seen[a.ToolCallID] = true
	}
	return req, nil
}

// decodeSubmitRequest reads and validates a submission body.
func decodeSubmitRequest(body io.Reader) (SubmitRequest, error) {
	var req SubmitRequest
	if err := decodeJSON(body, &req, "input, metadata"); err != nil {
		return SubmitRequest{}, err
	}
	if strings.TrimSpace(req.Input) == "" {
		return SubmitRequest{}, badRequest(`"input" is missing or empty; send {"input": "your question", "metadata": {}}`)
	}
	if m := bytes.TrimSpace(req.Metadata); len(m) > 0 && !bytes.Equal(m, []byte("null")) {
		if m[0] != '{' {
			return SubmitRequest{}, badRequest(`"metadata" must be a JSON object, like {"user": "ann"}`)
		}
		req.Metadata = m
	} else {
		req.Metadata = nil
	}
	return req, nil
}

// decodeCancelRequest reads the optional body of a cancellation.
func decodeCancelRequest(body io.Reader) (CancelRequest, error) {
	var req CancelRequest
	if err := decodeJSON(body, &req, "reason"); err != nil {
		if errors.Is(err, errEmptyBody) {
			return CancelRequest{}, nil
		}
		return CancelRequest{}, err
	}
	return req, nil
}

var errEmptyBody = badRequest("the request body is empty; send a JSON object")

// decodeJSON decodes exactly one JSON object from body into v, refusing
// unknown fields and trailing data. fields lists the allowed fields for
// the error message.
func decodeJSON(body io.Reader, v any, fields string) error {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, fields)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge(mbe.Limit)
		}
		return badRequest("the body has data after its JSON object; send one JSON object")
	}
	return nil
}

func jsonError(err error, fields string) error {
	var (
		mbe    *http.MaxBytesError
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return tooLarge(mbe.Limit)
	case errors.Is(err, io.EOF):
		return errEmptyBody
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("the JSON body ends too early; send a complete JSON object")
	case errors.As(err, &syntax):
		return badRequest("the body is not valid JSON (at byte %d: %v); send a JSON object", syntax.Offset, syntax)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badRequest("the body must be a JSON object with the fields %s", fields)
		}
		return badRequest("field %q must be a JSON %s, not %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return &apiError{Status: http.StatusBadRequest, Code: CodeUnknownField,
			Message: fmt.Sprintf("unknown field %s in the request body; the fields are: %s", name, fields)}
	}
	return badRequest("the body is not a valid request: %v; send a JSON object with the fields %s", err, fields)
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "string"
	case "bool":
		return "boolean (true or false)"
	case "slice":
		return "array"
	case "struct", "map":
		return "object"
	case "ptr":
		return "value of the documented type"
	}
	return "number"
}

func badRequest(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, CodeBadRequest, format, args...)
}

func tooLarge(limit int64) *apiError {
	return errorf(http.StatusRequestEntityTooLarge, CodeTooLarge,
		"the request body is over the limit of %d bytes; send a smaller body", limit)
}
