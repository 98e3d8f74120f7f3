package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/agenthost/agenthost/plugins/abi"
)

// SubmitRequest is the body of POST /v1/sessions/{id}/runs.
type SubmitRequest struct {
	// Input is the user's input; required, not empty.
	Input string `json:"input"`
	// Metadata is stored with the Run as given; it must be a JSON object,
	// nested at most maxNesting levels deep.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// Agent is the agent of the tenant the Run runs as; absent or "" is
	// the agent "default".
	Agent string `json:"agent,omitempty"`
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

// The shapes of the request bodies, for the strict reading (checkJSON).
var (
	submitShape = &shape{fields: []string{"input", "metadata", "agent"}}
	inputShape  = &shape{fields: []string{"approvals", "message"}, sub: map[string]*shape{
		"approvals": {elem: &shape{fields: []string{"tool_call_id", "approved", "reason"}}},
	}}
	cancelShape = &shape{fields: []string{"reason"}}
)

// DecodeInputRequest reads and validates an input request body. Its errors
// are *apiError values with status 400 (or 413 when body was capped with
// http.MaxBytesReader and is over the cap) whose message says what is
// wrong and what to send instead.
func DecodeInputRequest(body io.Reader) (InputRequest, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return InputRequest{}, readError(err)
	}
	return parseInputRequest(b)
}

// decodeInputRequest reads and validates the body of POST
// /v1/runs/{id}/input.
func decodeInputRequest(r *http.Request) (InputRequest, error) {
	body, err := readBody(r)
	if err != nil {
		return InputRequest{}, err
	}
	return parseInputRequest(body)
}

func parseInputRequest(body []byte) (InputRequest, error) {
	var req InputRequest
	if err := decodeJSON(body, &req, inputShape); err != nil {
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
			return InputRequest{}, badRequest(`approvals[%d] (tool call %q) has no "approved"; set it to true to approve or false to deny`, i, truncate(a.ToolCallID, 80))
		}
		if seen[a.ToolCallID] {
			return InputRequest{}, badRequest("tool call %q appears twice in approvals; send one decision per tool call", truncate(a.ToolCallID, 80))
		}
		seen[a.ToolCallID] = true
	}
	return req, nil
}

// decodeSubmitRequest reads and validates a submission body.
func decodeSubmitRequest(r *http.Request) (SubmitRequest, error) {
	body, err := readBody(r)
	if err != nil {
		return SubmitRequest{}, err
	}
	var req SubmitRequest
	if err := decodeJSON(body, &req, submitShape); err != nil {
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
func decodeCancelRequest(r *http.Request) (CancelRequest, error) {
	body, err := readBody(r)
	if err != nil {
		return CancelRequest{}, err
	}
	var req CancelRequest
	if err := decodeJSON(body, &req, cancelShape); err != nil {
		if errors.Is(err, errEmptyBody) {
			return CancelRequest{}, nil
		}
		return CancelRequest{}, err
	}
	return req, nil
}

var errEmptyBody = badRequest("the request body is empty; send a JSON object")

// readBody reads a request's body whole (http.MaxBytesReader caps it),
// once its Content-Type says JSON.
func readBody(r *http.Request) ([]byte, error) {
	if r.ContentLength != 0 { // a body, or one of unknown length
		if err := checkContentType(r.Header); err != nil {
			return nil, err
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		noteDetail(r, err)
		return nil, readError(err)
	}
	return body, nil
}

func readError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge(mbe.Limit)
	}
	return badRequest("the request body could not be read to its end; send the request again")
}

// checkContentType accepts a body declared as application/json, with no
// charset or charset=utf-8, or not declared at all (taken as JSON). Any
// other type answers 415: curl -d, for one, declares
// application/x-www-form-urlencoded.
func checkContentType(h http.Header) error {
	vals := h.Values("Content-Type")
	if len(vals) == 0 {
		return nil
	}
	if len(vals) == 1 {
		mt, params, err := mime.ParseMediaType(vals[0])
		if err == nil && mt == "application/json" {
			if cs, ok := params["charset"]; !ok || strings.EqualFold(cs, "utf-8") {
				return nil
			}
		}
	}
	return errorf(http.StatusUnsupportedMediaType, CodeMediaType,
		"the body is declared as Content-Type %q; the API takes JSON in UTF-8: send \"Content-Type: application/json\" "+
			"(with curl: -H 'Content-Type: application/json', or --json; -d alone declares application/x-www-form-urlencoded)",
		truncate(strings.Join(vals, ", "), 80))
}

// decodeJSON decodes exactly one JSON object from body into v, after the
// strict reading of checkJSON: valid UTF-8, no lone surrogate escapes, no
// key twice in an object, the fields of sh matched exactly (encoding/json
// alone would match them ignoring case), and free-form values nested at
// most maxNesting deep.
func decodeJSON(body []byte, v any, sh *shape) error {
	if err := checkJSON(body, sh); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err, strings.Join(sh.fields, ", "))
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
		// The decoder's text is about the client's own body.
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
	return badRequest("the body is not a valid request; send a JSON object with the fields %s", fields)
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

// maxNesting bounds how deep objects and arrays nest in a free-form value
// of a body, such as metadata ({} is one level).
const maxNesting = 64

// shape is what the strict reading of a body knows of one JSON value: an
// object's fields (matched exactly) or an array's elements. A nil shape is
// a free-form value: any JSON, its nesting bounded by maxNesting.
type shape struct {
	fields []string          // an object's field names, as messages list them
	sub    map[string]*shape // the fields with a shape of their own
	elem   *shape            // an array's elements
}

// checkJSON reads body as strictly as the API takes it: valid UTF-8 (no
// lone surrogate escapes either), one JSON value and nothing after it, no
// key twice in any object, the fields sh describes spelled exactly, and
// free-form values nested at most maxNesting deep. Type errors are left
// to encoding/json, whose messages name the field.
func checkJSON(body []byte, sh *shape) error {
	if at := invalidUTF8At(body); at >= 0 {
		return badRequest("the body is not valid UTF-8 (at byte %d); send JSON text encoded as UTF-8", at)
	}
	if at := loneSurrogateAt(body); at >= 0 {
		return badRequest(`the body escapes a lone UTF-16 surrogate (\u%s at byte %d), which is no character; escape characters outside the BMP as a surrogate pair, or send them as UTF-8`, body[at+2:at+6], at)
	}
	c := &checker{dec: json.NewDecoder(bytes.NewReader(body))}
	c.dec.UseNumber() // numbers are not parsed, only scanned
	if err := c.value(sh, 0); err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return ae
		}
		if errors.Is(err, io.EOF) && c.dec.InputOffset() > 0 {
			err = io.ErrUnexpectedEOF
		}
		return jsonError(err, strings.Join(sh.fields, ", "))
	}
	if _, err := c.dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("the body has data after its JSON object; send one JSON object")
	}
	return nil
}

// checker walks the tokens of a body; path is where it is, for messages.
type checker struct {
	dec  *json.Decoder
	path []pathElem
}

type pathElem struct {
	key     string
	index   int
	inArray bool // index, not key
}

// value reads one value of shape sh; depth is the nesting of the
// free-form value it is part of.
func (c *checker) value(sh *shape, depth int) error {
	tok, err := c.dec.Token()
	if err != nil {
		return err
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch {
	case d == '{' && sh != nil && sh.fields != nil:
		return c.object(sh, 0)
	case d == '[' && sh != nil && sh.elem != nil:
		return c.array(sh.elem, 0)
	}
	// Free-form, or not what the shape says (encoding/json names the
	// type error once the walk is through).
	if depth++; depth > maxNesting {
		return badRequest("%s nests objects and arrays more than %d levels deep; send at most %d levels", c.where(), maxNesting, maxNesting)
	}
	if d == '{' {
		return c.object(nil, depth)
	}
	return c.array(nil, depth)
}

// object reads the members of an object after its '{'.
func (c *checker) object(sh *shape, depth int) error {
	var seen keySet
	for c.dec.More() {
		tok, err := c.dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string) // the decoder's syntax check makes it a string
		if !seen.add(key) {
			return badRequest("the key %q appears twice in %s; send each key once", truncate(key, 80), c.where())
		}
		var sub *shape
		if sh != nil {
			if !slices.Contains(sh.fields, key) {
				return unknownField(key, c.where(), sh.fields)
			}
			sub = sh.sub[key]
		}
		c.path = append(c.path, pathElem{key: key})
		if err := c.value(sub, depth); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
	}
	_, err := c.dec.Token() // '}'
	return err
}

// array reads the elements of an array after its '['.
func (c *checker) array(elem *shape, depth int) error {
	for i := 0; c.dec.More(); i++ {
		c.path = append(c.path, pathElem{index: i, inArray: true})
		if err := c.value(elem, depth); err != nil {
			return err
		}
		c.path = c.path[:len(c.path)-1]
	}
	_, err := c.dec.Token() // ']'
	return err
}

// where names the value the checker is in: "the request body", or a
// path such as "metadata.tags[2]", quoted.
func (c *checker) where() string {
	if len(c.path) == 0 {
		return "the request body"
	}
	var b strings.Builder
	for i, p := range c.path {
		switch {
		case p.inArray:
			b.WriteString("[" + strconv.Itoa(p.index) + "]")
		case i > 0:
			b.WriteString("." + p.key)
		default:
			b.WriteString(p.key)
		}
	}
	return strconv.Quote(truncate(b.String(), 120))
}

func unknownField(name, where string, fields []string) *apiError {
	msg := fmt.Sprintf("unknown field %q in %s; the fields are: %s", truncate(name, 80), where, strings.Join(fields, ", "))
	for _, f := range fields {
		if strings.EqualFold(f, name) {
			msg += fmt.Sprintf(" (names are case-sensitive: send %q)", f)
			break
		}
	}
	return &apiError{Status: http.StatusBadRequest, Code: CodeUnknownField, Message: msg}
}

// keySet holds the keys of one object; most objects have few.
type keySet struct {
	few  []string
	many map[string]struct{}
}

// add adds key, reporting false if it was there already.
func (s *keySet) add(key string) bool {
	if s.many != nil {
		if _, ok := s.many[key]; ok {
			return false
		}
		s.many[key] = struct{}{}
		return true
	}
	if slices.Contains(s.few, key) {
		return false
	}
	if len(s.few) < 8 {
		s.few = append(s.few, key)
		return true
	}
	s.many = make(map[string]struct{}, 2*len(s.few))
	for _, k := range s.few {
		s.many[k] = struct{}{}
	}
	s.many[key] = struct{}{}
	return true
}

// invalidUTF8At returns the offset of the first byte of b that is not
// valid UTF-8, or -1.
func invalidUTF8At(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return -1
}

// loneSurrogateAt returns the offset of the first \uXXXX escape of body
// that is half of a UTF-16 surrogate pair without its other half, or -1.
// body is valid UTF-8; escapes only occur inside strings, so every
// backslash starts one.
func loneSurrogateAt(body []byte) int {
	for i := 0; i < len(body); {
		j := bytes.IndexByte(body[i:], '\\')
		if j < 0 {
			return -1
		}
		i += j
		r, ok := hexEscape(body, i)
		switch {
		case !ok:
			i += 2 // \n, \\, … (or a malformed escape the decoder refuses)
			continue
		case r >= 0xDC00 && r <= 0xDFFF:
			return i
		case r >= 0xD800 && r <= 0xDBFF:
			if lo, ok := hexEscape(body, i+6); !ok || lo < 0xDC00 || lo > 0xDFFF {
				return i
			}
			i += 12
			continue
		}
		i += 6
	}
	return -1
}

// hexEscape reads the \uXXXX escape at body[i:], if there is one.
func hexEscape(body []byte, i int) (rune, bool) {
	if i+6 > len(body) || body[i] != '\\' || body[i+1] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(body[i+2:i+6]), 16, 16)
	if err != nil {
		return 0, false
	}
	return rune(n), true
}

func badRequest(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, CodeBadRequest, format, args...)
}

func tooLarge(limit int64) *apiError {
	return errorf(http.StatusRequestEntityTooLarge, CodeTooLarge,
		"the request body is over the limit of %d bytes; send a smaller body", limit)
}
