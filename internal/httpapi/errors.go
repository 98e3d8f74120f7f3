package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// Error codes of the JSON error body. They are part of the API: clients
// switch on them, people read the message.
const (
	CodeBadRequest      = "bad_request"       // the request is malformed (see the message)
	CodeUnknownField    = "unknown_field"     // the JSON body has a field the API does not know
	CodeInvalidSession  = "invalid_session"   // a session ID outside [A-Za-z0-9_-]{1,64}
	CodeUnauthorized    = "unauthorized"      // no bearer token, or one no tenant has
	CodeNotFound        = "not_found"         // no such route
	CodeRunNotFound     = "run_not_found"     // no such Run for this tenant
	CodeSessionNotFound = "session_not_found" // no Run in that session for this tenant
	CodeMethod          = "method_not_allowed"
	CodeTooLarge        = "body_too_large"
	CodeMediaType       = "unsupported_media_type" // the body is declared as something other than JSON
	CodeKeyReused       = "idempotency_key_reused" // the Idempotency-Key was used for a different submission
	CodeRunTerminal     = "run_terminal"           // the Run has ended
	CodeNotAwaiting     = "not_awaiting"           // the Run does not wait for that input or approval
	CodeUnknownToolCall = "unknown_tool_call"      // no tool call of the Run's current step has that ID
	CodeRunChanged      = "run_changed"            // the Run is past the version If-Match names
	CodeQuotaActiveRuns = "quota_active_runs"
	CodeQuotaInFlight   = "quota_in_flight_effects"
	CodeQuotaTokens     = "quota_token_budget"
	CodeUnavailable     = "unavailable" // the server is stopping, not ready, or the store is unavailable
	CodeInternal        = "internal"
)

// apiError is an error with its HTTP status and JSON error body.
type apiError struct {
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration // sets Retry-After when > 0
	Allow      string        // sets Allow on 405
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// errorBody is the JSON body of every failure:
// {"error": {"code", "message", "request_id"}}.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		// RequestID is the response's X-Request-ID: the server's log line
		// of the request carries it too.
		RequestID string `json:"request_id"`
	} `json:"error"`
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	if e.RetryAfter > 0 {
		secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	if e.Allow != "" {
		w.Header().Set("Allow", e.Allow)
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agenthost"`)
	}
	var b errorBody
	// logRequests set the ID, unless this answer comes from outside it.
	b.Error.Code, b.Error.Message, b.Error.RequestID = e.Code, e.Message, responseRequestID(w)
	writeJSON(w, e.Status, b)
}

// internalEncodingError is the body of an answer the server could not
// encode.
const internalEncodingError = `{"error":{"code":"internal","message":"the server could not encode its answer; this is a bug, please report it"}}` + "\n"

// writeJSON answers with v as JSON, encoded straight onto w. The status
// line goes out with the first byte of the body, so an encoding failure
// (which writes nothing) can still answer 500.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	lw := &lazyStatus{w: w, status: status}
	if err := json.NewEncoder(lw).Encode(v); err != nil && !lw.wrote {
		// Every value written here is built by this package; a failure is
		// a bug, reported without the value.
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, internalEncodingError)
	}
}

// lazyStatus writes its status just before the first byte of the body.
type lazyStatus struct {
	w      http.ResponseWriter
	status int
	wrote  bool
}

func (l *lazyStatus) Write(b []byte) (int, error) {
	if !l.wrote {
		l.wrote = true
		l.w.WriteHeader(l.status)
	}
	return l.w.Write(b)
}

func runNotFound(runID string) *apiError {
	return errorf(http.StatusNotFound, CodeRunNotFound,
		"run %q not found; check the run ID (it is the \"id\" the submission answered) and that the token belongs to the tenant that submitted it", runID)
}

// runError maps an error of the runtime about one of the caller's Runs to
// an API error. The message is the API's own text, never the error's: the
// runtime's and the loop's texts name internals (packages, event types).
// The error itself goes to the request's log line, under its request ID.
func (s *Server) runError(r *http.Request, runID string, err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	noteDetail(r, err)
	switch {
	case errors.Is(err, runtime.ErrRunNotFound), errors.Is(err, loop.ErrInvalidID):
		return runNotFound(runID)
	case errors.Is(err, loop.ErrTerminal):
		return errorf(http.StatusConflict, CodeRunTerminal,
			"run %q has ended; it accepts no more input, approvals or cancellation. GET /v1/runs/%s shows how it ended", runID, runID)
	case errors.Is(err, loop.ErrUnknownToolCall):
		return errorf(http.StatusConflict, CodeUnknownToolCall,
			"an approval names a tool call that the Run's current step does not have; GET /v1/runs/%s shows the tool call IDs waiting for an approval under waiting.approvals", runID)
	case errors.Is(err, loop.ErrNotAwaiting):
		return errorf(http.StatusConflict, CodeNotAwaiting,
			"run %q does not wait for that input or approval now; GET /v1/runs/%s shows what it waits for under \"waiting\"", runID, runID)
	case errors.Is(err, runtime.ErrRunChanged):
		// The runtime found the Run moved on between the handler's read
		// and its write.
		return errorf(http.StatusPreconditionFailed, CodeRunChanged,
			"run %q moved past the version If-Match names; nothing was written. GET /v1/runs/%s for what it waits for now, and send again with its ETag", runID, runID)
	case errors.Is(err, loop.ErrInvalidEvent):
		return errorf(http.StatusBadRequest, CodeBadRequest,
			"run %q cannot take this request in its current state; nothing was written. GET /v1/runs/%s for what it waits for", runID, runID)
	}
	return s.unavailableOrInternal(r, err)
}

// unavailableOrInternal answers 503 for the failures that go away by
// themselves (stopping, store unavailable, session moving between nodes)
// and 500 for the rest, logging the detail either way under the
// request's ID.
func (s *Server) unavailableOrInternal(r *http.Request, err error) *apiError {
	noteDetail(r, err)
	switch {
	case errors.Is(err, runtime.ErrClosed), errors.Is(err, runtime.ErrStoreUnavailable),
		errors.Is(err, runtime.ErrSessionOwned), errors.Is(err, runtime.ErrNodeExpired), errors.Is(err, runtime.ErrFenced):
		s.log.Warn("request failed; answering 503", "method", r.Method, "path", r.URL.Path, "request_id", requestIDOf(r), "err", err)
		e := errorf(http.StatusServiceUnavailable, CodeUnavailable,
			"the server cannot serve this request right now (it is stopping, or the Run's session is moving between nodes); retry after the Retry-After delay")
		e.RetryAfter = s.cfg.RetryAfter
		return e
	}
	s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "request_id", requestIDOf(r), "err", err)
	return errorf(http.StatusInternalServerError, CodeInternal,
		"the server failed to handle the request; it has been logged. Retry later, and report it with the request_id if it persists")
}
