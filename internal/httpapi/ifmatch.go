package httpapi

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// A Run's entity tag is its seq, quoted: "12". Every response that carries
// one Run sets it as ETag. A client that sends it back in If-Match on
// POST /v1/runs/{id}/input or /cancel has the request applied only while
// the Run is still at that version; otherwise it gets 412 run_changed and
// nothing is written. That makes an answer safe to retry: it can never
// land on a question the client has not seen.

// etag is a Run's entity tag.
func etag(run loop.Run) string { return `"` + strconv.FormatInt(run.Seq, 10) + `"` }

// writeRun answers with one Run of the request's tenant and its ETag.
func (s *Server) writeRun(w http.ResponseWriter, r *http.Request, tenant string, status int, run loop.Run) {
	w.Header().Set("ETag", etag(run))
	writeJSON(w, status, s.runJSON(r.Context(), tenant, run))
}

// ifMatch is a request's If-Match precondition on a Run's version.
type ifMatch struct {
	seq int64
	set bool
}

// parseIfMatch reads If-Match. Absent or "*" (any version) is no
// precondition; otherwise it must be exactly one strong entity tag as
// ETag gives it.
func parseIfMatch(r *http.Request) (ifMatch, error) {
	vals := r.Header.Values("If-Match")
	if len(vals) == 0 {
		return ifMatch{}, nil
	}
	v := strings.TrimSpace(strings.Join(vals, ","))
	if v == "*" {
		return ifMatch{}, nil
	}
	const how = `send the ETag of GET /v1/runs/{id} (the Run's "seq", in quotes), as in If-Match: "12"`
	switch {
	case strings.HasPrefix(v, "W/"):
		return ifMatch{}, badRequest("If-Match %s is a weak entity tag; Run versions compare strongly: %s", truncate(v, 40), how)
	case strings.Contains(v, ","):
		return ifMatch{}, badRequest("If-Match %s names more than one version; %s", truncate(v, 40), how)
	}
	unq, ok := strings.CutPrefix(v, `"`)
	if ok {
		unq, ok = strings.CutSuffix(unq, `"`)
	}
	seq, err := strconv.ParseInt(unq, 10, 64)
	if !ok || err != nil || seq < 0 {
		return ifMatch{}, badRequest("If-Match %s is not a Run's entity tag; %s", truncate(v, 40), how)
	}
	return ifMatch{seq: seq, set: true}, nil
}

// check answers 412 run_changed if the Run is past the version named.
func (m ifMatch) check(run loop.Run) error {
	if m.set && run.Seq != m.seq {
		return runChanged(run.ID, run.Seq, m.seq)
	}
	return nil
}

// opts hands the precondition to the runtime, which checks it again under
// the Run's lock, atomically with the write.
func (m ifMatch) opts() []runtime.InputOption {
	if !m.set {
		return nil
	}
	return []runtime.InputOption{runtime.IfSeq(m.seq)}
}

func runChanged(runID string, seq, want int64) *apiError {
	return errorf(http.StatusPreconditionFailed, CodeRunChanged,
		`run %q is at version "%d", not "%d" as If-Match says; nothing was written. GET /v1/runs/%s for what it waits for now, and send again with its ETag`,
		runID, seq, want, runID)
}
