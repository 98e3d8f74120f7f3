package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// TenantRunListJSON is a page of GET /v1/runs: a summary of each of the
// tenant's Runs (of one status, or of every status), in the order of
// their IDs: a Run's ID begins with its creation time in milliseconds, so
// that is oldest first, or, with ?order=newest, newest first.
type TenantRunListJSON struct {
	Runs []TenantRunJSON `json:"runs"`
	// NextAfter is the "after" of the next page (the last Run's ID): the
	// next page holds the Runs that come after it in the page's order
	// (later IDs oldest first, earlier ones newest first). Absent on the
	// last page.
	NextAfter string `json:"next_after,omitempty"`
}

// TenantRunJSON is a Run's summary in GET /v1/runs. It is RunSummaryJSON
// without the ordinal, which the store's status index does not hold: GET
// /v1/sessions/{id}/runs gives a Run's place in its session.
type TenantRunJSON struct {
	RunSummaryJSON
	// Ordinal hides RunSummaryJSON's (always absent here).
	Ordinal int64 `json:"ordinal,omitempty"`
}

// listTenantRuns serves GET /v1/runs?status=&agent=&order=&after=&limit=:
// the tenant's Runs through the store's status index, a page at a time,
// oldest first, or newest first with order=newest (the index read
// backwards). after is the last Run of the page before in either order.
// Without a status it merges the six statuses' indexes by ID. A Run that
// changes status while the page is read is shown once, as it is when
// loaded; with a status filter, one that has left that status is left
// out. The agent filter is applied to the Runs of the page as they are
// loaded (the store keeps no index by agent), so a page may hold fewer
// than limit Runs, or none, and still end with next_after: follow it.
func (s *Server) listTenantRuns(w http.ResponseWriter, r *http.Request, tenant string) error {
	q := r.URL.Query()
	agent := q.Get("agent")
	if agent != "" && !loop.ValidID(agent) {
		return badRequest("query parameter \"agent\" is %q; it must be an agent's name (GET /v1/agents lists them), or absent for every agent", truncate(agent, 80))
	}
	statuses := allStatuses
	if v := q.Get("status"); v != "" {
		st := loop.Status(v)
		if !slices.Contains(allStatuses, st) {
			return badRequest("query parameter \"status\" is %q; it must be one of pending, running, waiting, completed, failed or cancelled (or absent, for every status)", truncate(v, 40))
		}
		statuses = []loop.Status{st}
	}
	newest := false
	switch v := q.Get("order"); v {
	case "", "oldest":
	case "newest":
		newest = true
	default:
		return badRequest("query parameter \"order\" is %q; it must be oldest (the default) or newest", truncate(v, 40))
	}
	after := q.Get("after")
	if after != "" && !loop.ValidID(after) {
		return badRequest("query parameter \"after\" is %q; it must be a Run ID, the next_after of the page before", truncate(after, 80))
	}
	limit, err := queryInt(r, "limit", defaultPageLimit, 1, maxPageLimit)
	if err != nil {
		return err
	}
	ids, more, err := s.tenantRunIDs(r.Context(), tenant, statuses, newest, after, int(limit))
	if err != nil {
		return err
	}
	page := TenantRunListJSON{Runs: make([]TenantRunJSON, 0, len(ids))}
	budget := s.cfg.MaxPageBytes - len(`{"runs":[],"next_after":""}`) - 2*loop.MaxIDLen
	for i, id := range ids {
		run, err := s.cfg.Store.LoadRun(r.Context(), tenant, id)
		if errors.Is(err, runtime.ErrRunNotFound) {
			continue // gone between the index read and this one
		}
		if err != nil {
			return err
		}
		if len(statuses) == 1 && run.Status != statuses[0] {
			continue // it moved on since the index read
		}
		if agent != "" && runAgent(run) != agent {
			continue
		}
		sum := TenantRunJSON{RunSummaryJSON: NewRunSummaryJSON(0, run)}
		if budget -= summarySize(sum); budget < 0 && len(page.Runs) > 0 {
			s.cfg.OnLimit(LimitPageBytes, tenant)
			page.NextAfter = ids[i-1]
			writeJSON(w, http.StatusOK, page)
			return nil
		}
		page.Runs = append(page.Runs, sum)
	}
	if more && len(ids) > 0 {
		page.NextAfter = ids[len(ids)-1]
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// tenantRunIDs returns the first limit IDs after after of the tenant's
// Runs of the statuses, in ID order (in descending ID order, and so those
// before after, when newest), and whether there are more.
func (s *Server) tenantRunIDs(ctx context.Context, tenant string, statuses []loop.Status, newest bool, after string, limit int) ([]string, bool, error) {
	read := s.cfg.Store.RunsByStatus
	if newest {
		read = s.cfg.Store.RunsByStatusDesc
	}
	var ids []string
	for _, st := range statuses {
		got, err := read(ctx, tenant, st, after, limit+1)
		if err != nil {
			return nil, false, err
		}
		ids = append(ids, got...)
	}
	slices.Sort(ids)
	if newest {
		slices.Reverse(ids)
	}
	ids = slices.Compact(ids) // a Run read under two statuses as it moved
	if len(ids) > limit {
		return ids[:limit], true, nil
	}
	return ids, false, nil
}

// summarySize is the length of a summary's JSON, with its comma.
func summarySize(v TenantRunJSON) int {
	b, err := json.Marshal(v)
	if err != nil {
		return 0
	}
	return len(b) + 1
}
