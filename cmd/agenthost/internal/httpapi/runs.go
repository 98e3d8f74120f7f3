package httpapi

import (
	"errors"
	"net/http"
	"strconv"

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
	req, err := decodeSubmitRequest(r.Body)
	if err != nil {
		return err
	}
	// A tenant's submissions are serialized only when it has a quota, so
	// that the check and the submission are one step; without one they
	// share the store's group commits.
	if q := s.cfg.Quotas[tenant]; q.bounded() {
		lock := s.tenantLock(tenant)
		lock.Lock()
		defer lock.Unlock()
		if err := s.checkQuota(r.Context(), tenant); err != nil {
			return err
		}
	}
	run, dup, err := s.cfg.Runtime.Submit(r.Context(), runtime.Request{
		Tenant: tenant, Session: session, Input: req.Input, Metadata: req.Metadata, IdempotencyKey: key,
	})
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/runs/"+run.ID)
	status := http.StatusCreated
	if dup {
		w.Header().Set(ReplayedHeader, "true")
		status = http.StatusOK
	}
	writeRun(w, status, run)
	return nil
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
	writeRun(w, http.StatusOK, run)
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
	req, err := DecodeInputRequest(r.Body)
	if err != nil {
		return err
	}
	if err := im.check(run); err != nil {
		return err
	}
	var cur loop.Run
	if req.Message != nil {
		cur, err = s.cfg.Runtime.ProvideInput(r.Context(), tenant, run.ID, *req.Message, im.opts()...)
	} else {
		cur, err = s.cfg.Runtime.Approve(r.Context(), tenant, run.ID, req.Decisions(), im.opts()...)
	}
	if err != nil {
		return s.runError(r, run.ID, err)
	}
	writeRun(w, http.StatusOK, cur)
	return nil
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
	req, err := decodeCancelRequest(r.Body)
	if err != nil {
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
	writeRun(w, http.StatusAccepted, cur)
	return nil
}

// Paging of GET /v1/sessions/{id}/runs.
const (
	defaultPageLimit = 50
	maxPageLimit     = 500
)

// SessionRunsJSON is a page of a session's Runs.
type SessionRunsJSON struct {
	Runs []SessionRunJSON `json:"runs"`
	// NextAfter is the "after" of the next page; absent on the last one.
	NextAfter *int64 `json:"next_after,omitempty"`
}

// SessionRunJSON is a Run with its place in the session (from 1).
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
	page, err := s.cfg.Store.SessionRuns(r.Context(), tenant, session, after, int(limit)+1)
	if err != nil {
		return err
	}
	if len(page) == 0 {
		// An empty page past the end is fine; a session with no Run at all
		// does not exist for this tenant.
		exists := false
		if after > 0 {
			first, err := s.cfg.Store.SessionRuns(r.Context(), tenant, session, 0, 1)
			if err != nil {
				return err
			}
			exists = len(first) > 0
		}
		if !exists {
			return errorf(http.StatusNotFound, CodeSessionNotFound,
				"session %q has no Runs for this tenant; submit one with POST /v1/sessions/%s/runs", session, session)
		}
	}
	out := SessionRunsJSON{Runs: []SessionRunJSON{}}
	for i, sr := range page {
		if i == int(limit) {
			next := page[i-1].Ordinal
			out.NextAfter = &next
			break
		}
		out.Runs = append(out.Runs, SessionRunJSON{Ordinal: sr.Ordinal, RunJSON: NewRunJSON(sr.Run)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
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
