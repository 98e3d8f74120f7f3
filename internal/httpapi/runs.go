package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// Idempotency keys are 1 to maxIdempotencyKey visible ASCII characters.
const maxIdempotencyKey = 255

// ReplayedHeader is set to "true" on the answer to a submission whose
// Idempotency-Key matched an earlier one: the Run shown is that one.
const ReplayedHeader = "Idempotent-Replayed"

func (s *Server) submitRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	session := r.PathValue("id")
	if !loop.ValidID(session) {
		return errorf(http.StatusBadRequest, CodeInvalidSession,
			"session ID %q is invalid: it must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'", truncate(session, 80))
	}
	key := r.Header.Get("Idempotency-Key")
	if err := checkIdempotencyKey(key); err != nil {
		return err
	}
	req, err := decodeSubmitRequest(r)
	if err != nil {
		return err
	}
	run, dup, err := s.submit(r.Context(), tenant, session, key, req)
	if errors.Is(err, runtime.ErrUnknownAgent) {
		noteDetail(r, err)
		return s.agentNotFound(tenant, req.Agent)
	}
	if err != nil {
		return err
	}
	if dup {
		if err := checkReplay(key, run, session, req); err != nil {
			return err
		}
	}
	w.Header().Set("Location", "/v1/runs/"+run.ID)
	status := http.StatusCreated
	if dup {
		w.Header().Set(ReplayedHeader, "true")
		status = http.StatusOK
	}
	s.writeRun(w, r, tenant, status, run)
	return nil
}

// submit checks a submission's fields against the tenant's limits and
// its quotas, and submits it: one step when the tenant has a quota. The
// API's submissions and the MCP endpoint's tool calls come through here.
// A name the tenant has no agent of is runtime.ErrUnknownAgent.
func (s *Server) submit(ctx context.Context, tenant, session, key string, req SubmitRequest) (loop.Run, bool, error) {
	if err := s.checkSubmitFields(tenant, req); err != nil {
		return loop.Run{}, false, err
	}
	// A tenant's submissions are serialized only when it has a quota, so
	// that the check and the submission are one step; without one they
	// share the store's group commits.
	var res *Reservation
	if q := s.tenants().quotas[tenant]; q.bounded() {
		stored := SubmissionStoredBytes(req, key)
		if err := s.checkSubmissionFits(tenant, req, stored); err != nil {
			return loop.Run{}, false, err
		}
		lock := s.tenantLock(tenant)
		lock.Lock()
		defer lock.Unlock()
		var err error
		if res, err = s.checkQuota(ctx, tenant, stored); err != nil {
			return loop.Run{}, false, err
		}
	}
	run, dup, err := s.cfg.Runtime.Submit(ctx, runtime.Request{
		Tenant: tenant, Session: session, Input: req.Input, Metadata: req.Metadata, IdempotencyKey: key, Agent: req.Agent,
	})
	settleReservation(res, err, dup)
	return run, dup, err
}

// checkReplay answers 422 idempotency_key_reused unless the submission
// that matched key is a replay of the one that made run: the same
// session, the same input, and the same metadata (as JSON values: the
// spacing, the order of keys and the escapes of strings do not matter;
// numbers compare as written). A key names one submission, as the IETF
// idempotency-key draft has it; reusing it for another would otherwise
// silently answer with a Run the client did not ask for. Keys are the
// tenant's own, so another tenant's never matches.
func checkReplay(key string, run loop.Run, session string, req SubmitRequest) error {
	var diff []string
	if run.Session != session {
		diff = append(diff, fmt.Sprintf("session (it was %q)", run.Session))
	}
	if run.Input != req.Input {
		diff = append(diff, "input")
	}
	if !sameJSON(run.Metadata, req.Metadata) {
		diff = append(diff, "metadata")
	}
	if was, asked := runAgent(run), agentOrDefault(req.Agent); was != asked {
		diff = append(diff, fmt.Sprintf("agent (it was %q)", was))
	}
	if len(diff) == 0 {
		return nil
	}
	return errorf(http.StatusUnprocessableEntity, CodeKeyReused,
		"Idempotency-Key %q was used for run %q, which has a different %s; a key names one submission. "+
			"Send this submission with a new Idempotency-Key; to get run %q back, send its original body to its session again, or GET /v1/runs/%s",
		key, run.ID, strings.Join(diff, " and "), run.ID, run.ID)
}

// sameJSON reports whether two metadata values are the same JSON value;
// an absent value and null are the same.
func sameJSON(a, b json.RawMessage) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if bytes.Equal(a, b) {
		return true
	}
	va, okA := decodeValue(a)
	vb, okB := decodeValue(b)
	return okA && okB && reflect.DeepEqual(va, vb)
}

func decodeValue(raw []byte) (any, bool) {
	if len(raw) == 0 {
		return nil, true
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	return v, true
}

func checkIdempotencyKey(key string) error {
	if key == "" {
		return nil
	}
	if len(key) > maxIdempotencyKey {
		return badRequest("the Idempotency-Key header is %d bytes; the limit is %d", len(key), maxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return badRequest("the Idempotency-Key header may hold only visible ASCII characters (no spaces); a UUID works")
		}
	}
	return nil
}

// loadRun returns the tenant's Run, or a 404 that looks the same whether
// the Run does not exist or belongs to another tenant.
func (s *Server) loadRun(r *http.Request, tenant string) (loop.Run, error) {
	id := r.PathValue("id")
	if !loop.ValidID(id) {
		return loop.Run{}, runNotFound(truncate(id, 80))
	}
	run, err := s.cfg.Runtime.LoadRun(r.Context(), tenant, id)
	if err != nil {
		return loop.Run{}, s.runError(r, id, err)
	}
	return run, nil
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	run, err := s.loadRun(r, tenant)
	if err != nil {
		return err
	}
	s.writeRun(w, r, tenant, http.StatusOK, run)
	return nil
}

func (s *Server) postInput(w http.ResponseWriter, r *http.Request, tenant string) error {
	run, err := s.loadRun(r, tenant)
	if err != nil {
		return err
	}
	im, err := parseIfMatch(r)
	if err != nil {
		return err
	}
	req, err := decodeInputRequest(r)
	if err != nil {
		return err
	}
	if err := s.checkInputFields(tenant, req); err != nil {
		return err
	}
	if err := im.check(run); err != nil {
		return err
	}
	// An ended Run takes nothing (the runtime answers 409): only the
	// others are weighed against the storage quota.
	var res *Reservation
	if !run.Status.Terminal() {
		if res, err = s.reserveInput(r.Context(), tenant, req); err != nil {
			return err
		}
	}
	var cur loop.Run
	if req.Message != nil {
		cur, err = s.cfg.Runtime.ProvideInput(r.Context(), tenant, run.ID, *req.Message, im.opts()...)
	} else {
		cur, err = s.cfg.Runtime.Approve(r.Context(), tenant, run.ID, req.Decisions(), im.opts()...)
	}
	settleReservation(res, err, false)
	if err != nil {
		return approvalError(s.runError(r, run.ID, err), run, req)
	}
	s.writeRun(w, r, tenant, http.StatusOK, cur)
	return nil
}

// approvalError names, in a refusal of approvals, the tool calls of the
// request that the Run (as the handler read it) does not wait on.
func approvalError(ae *apiError, run loop.Run, req InputRequest) *apiError {
	if len(req.Approvals) == 0 || (ae.Code != CodeUnknownToolCall && ae.Code != CodeNotAwaiting) {
		return ae
	}
	waiting := runtime.WaitingFor(run).Approvals
	var ids []string
	for _, a := range req.Approvals {
		if !slices.Contains(waiting, a.ToolCallID) && len(ids) < 5 {
			ids = append(ids, strconv.Quote(truncate(a.ToolCallID, 80)))
		}
	}
	if len(ids) == 0 {
		return ae
	}
	what := "does not wait for an approval"
	if ae.Code == CodeUnknownToolCall {
		what = "is not a tool call of the Run's current step"
	}
	return errorf(ae.Status, ae.Code, "tool call %s %s; GET /v1/runs/%s shows the tool calls waiting for an approval under waiting.approvals",
		strings.Join(ids, ", "), what, run.ID)
}

func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request, tenant string) error {
	run, err := s.loadRun(r, tenant)
	if err != nil {
		return err
	}
	im, err := parseIfMatch(r)
	if err != nil {
		return err
	}
	req, err := decodeCancelRequest(r)
	if err != nil {
		return err
	}
	// A cancellation's reason is bounded, but the storage quota never
	// refuses one: it is how a tenant at its quota ends the Runs it no
	// longer needs, and it adds at most StoredBytesBound of the reason.
	if err := s.checkCancelFields(tenant, req); err != nil {
		return err
	}
	if err := im.check(run); err != nil {
		return err
	}
	if run.Status.Terminal() {
		return errorf(http.StatusConflict, CodeRunTerminal, "run %q is %s already; there is nothing to cancel", run.ID, run.Status)
	}
	reason := req.Reason
	if reason == "" {
		reason = "cancelled through the API"
	}
	cur, err := s.cfg.Runtime.Cancel(r.Context(), tenant, run.ID, reason, im.opts()...)
	if errors.Is(err, loop.ErrNoChange) { // already being cancelled or ending
		cur, err = s.cfg.Runtime.LoadRun(r.Context(), tenant, run.ID)
	}
	if err != nil {
		return s.runError(r, run.ID, err)
	}
	s.writeRun(w, r, tenant, http.StatusAccepted, cur)
	return nil
}

// Paging of GET /v1/sessions/{id}/runs.
const (
	defaultPageLimit = 50
	maxPageLimit     = 500
	// DefaultMaxPageBytes bounds the JSON of one page when
	// Config.MaxPageBytes is not set (1 MiB).
	DefaultMaxPageBytes = 1 << 20
	// pageChunk is how many Runs a page reads from the store at a time:
	// the store hands over whole Runs, inputs and all, so a page of large
	// Runs holds only this many at once.
	pageChunk = 64
)

// LimitPageBytes is how OnLimit names a page cut short by its byte bound.
const LimitPageBytes = "max_page_bytes"

// RunListJSON is a page of a session's Runs: a summary of each, oldest
// first. GET /v1/runs/{id} gives a Run whole.
type RunListJSON struct {
	Runs []RunSummaryJSON `json:"runs"`
	// NextAfter is the "after" of the next page; absent on the last one.
	NextAfter *int64 `json:"next_after,omitempty"`
}

// SessionRunsJSON was the shape of a page when it carried whole Runs.
//
// Deprecated: pages carry summaries (RunListJSON) now; decoding one into
// SessionRunsJSON leaves the Runs' input, metadata, result, failure and
// waiting empty.
type SessionRunsJSON struct {
	Runs      []SessionRunJSON `json:"runs"`
	NextAfter *int64           `json:"next_after,omitempty"`
}

// SessionRunJSON is a Run with its place in the session (from 1).
//
// Deprecated: see SessionRunsJSON.
type SessionRunJSON struct {
	Ordinal int64 `json:"ordinal"`
	RunJSON
}

func (s *Server) listSessionRuns(w http.ResponseWriter, r *http.Request, tenant string) error {
	session := r.PathValue("id")
	if !loop.ValidID(session) {
		return errorf(http.StatusBadRequest, CodeInvalidSession,
			"session ID %q is invalid: it must be 1 to 64 characters of A-Z, a-z, 0-9, '_' and '-'", truncate(session, 80))
	}
	after, err := queryInt(r, "after", 0, 0, 1<<62)
	if err != nil {
		return err
	}
	limit, err := queryInt(r, "limit", defaultPageLimit, 1, maxPageLimit)
	if err != nil {
		return err
	}
	return s.writeRunList(w, r, tenant, session, after, int(limit), s.cfg.MaxPageBytes)
}

// writeRunList answers with the page of the session's Runs after the
// ordinal after: at most limit of them, and at most maxBytes of JSON
// (but never less than one Run, so that paging moves on). The page is
// encoded as it is read, Run by Run, and its next_after is the ordinal of
// its last Run when the session has more.
func (s *Server) writeRunList(w http.ResponseWriter, r *http.Request, tenant, session string, after int64, limit, maxBytes int) error {
	ctx := r.Context()
	read := func(after int64, written int) ([]runtime.SessionRun, bool, error) {
		// The last chunk reads one Run more, to know whether there is a
		// next page.
		n := min(limit-written, pageChunk)
		last := n == limit-written
		if last {
			n++
		}
		page, err := s.cfg.Store.SessionRuns(ctx, tenant, session, after, n)
		return page, last, err
	}
	chunk, last, err := read(after, 0)
	if err != nil {
		return err
	}
	if len(chunk) == 0 {
		if err := s.sessionExists(ctx, tenant, session, after); err != nil {
			return err
		}
	}

	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	pw := &pageWriter{w: w, budget: maxBytes - len(pageHead) - len(pageTailMax)}
	pw.begin()
	written, cursor := 0, after
	for {
		for i, sr := range chunk {
			if written == limit {
				// The extra Run of the last chunk: there is a next page.
				return pw.end(&cursor)
			}
			if !pw.add(NewRunSummaryJSON(sr.Ordinal, sr.Run)) {
				s.cfg.OnLimit(LimitPageBytes, tenant)
				return pw.end(&cursor) // full: the next page starts here
			}
			if pw.err != nil {
				return nil // the client is gone
			}
			written, cursor = written+1, sr.Ordinal
			chunk[i] = runtime.SessionRun{} // let the Run go
		}
		if last || len(chunk) < pageChunk {
			return pw.end(nil) // the session has no more
		}
		if chunk, last, err = read(cursor, written); err != nil {
			if ctx.Err() != nil {
				return nil // the client is gone
			}
			// The status is sent: end the page where it got to. The client
			// reads on from next_after, and gets the error then.
			s.log.Warn("a page of session runs ended early", "request_id", requestIDOf(r), "session", session, "err", err)
			return pw.end(&cursor)
		}
	}
}

// sessionExists answers 404 session_not_found for an empty page unless
// the session has a Run before after: an empty page past the end is
// fine, but a session without Runs does not exist for this tenant.
func (s *Server) sessionExists(ctx context.Context, tenant, session string, after int64) error {
	if after > 0 {
		first, err := s.cfg.Store.SessionRuns(ctx, tenant, session, 0, 1)
		if err != nil {
			return err
		}
		if len(first) > 0 {
			return nil
		}
	}
	return errorf(http.StatusNotFound, CodeSessionNotFound,
		"session %q has no Runs for this tenant; submit one with POST /v1/sessions/%s/runs", session, session)
}

// The JSON around a page's Runs; next_after's digits are at most 19.
const (
	pageHead    = `{"runs":[`
	pageTailMax = `],"next_after":9223372036854775807}` + "\n"
)

// pageWriter encodes a page of RunListJSON onto w, one Run at a time,
// within a byte budget for the Runs.
type pageWriter struct {
	w      http.ResponseWriter
	budget int // bytes left for Runs
	n      int // Runs written
	buf    bytes.Buffer
	enc    *json.Encoder
	err    error // the first write error: the client is gone
}

func (p *pageWriter) begin() {
	p.enc = json.NewEncoder(&p.buf)
	p.write([]byte(pageHead))
}

// add writes one Run's summary, unless it would take the page past its
// budget (and the page has a Run already); it reports whether it did.
func (p *pageWriter) add(v RunSummaryJSON) bool {
	p.buf.Reset()
	if p.n > 0 {
		p.buf.WriteByte(',')
	}
	if err := p.enc.Encode(v); err != nil {
		// A summary holds plain values only; should one fail, the page is
		// cut off, and the client sees it is not whole.
		p.err = err
		return true
	}
	item := bytes.TrimSuffix(p.buf.Bytes(), []byte("\n"))
	if p.n > 0 && len(item) > p.budget {
		return false
	}
	p.budget -= len(item)
	p.n++
	p.write(item)
	return true
}

// end closes the page, with next_after when next is set.
func (p *pageWriter) end(next *int64) error {
	tail := "]}\n"
	if next != nil {
		tail = `],"next_after":` + strconv.FormatInt(*next, 10) + "}\n"
	}
	p.write([]byte(tail))
	return nil
}

func (p *pageWriter) write(b []byte) {
	if p.err == nil {
		_, p.err = p.w.Write(b)
	}
}

// queryInt reads an integer query parameter within [lo, hi].
func queryInt(r *http.Request, name string, def, lo, hi int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, badRequest("query parameter %q is %q; it must be an integer from %d to %d", name, truncate(v, 40), lo, hi)
	}
	return n, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
