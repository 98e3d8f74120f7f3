package httpapi_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func (e *env) tenantRuns(token, query string) httpapi.TenantRunListJSON {
	e.t.Helper()
	r := e.do("GET", "/v1/runs"+query, token, "")
	require.Equal(e.t, http.StatusOK, r.Status, "body: %s", r.Body)
	require.NotContains(e.t, string(r.Body), `"ordinal"`, "the status index holds no ordinal: the listing shows none")
	var page httpapi.TenantRunListJSON
	require.NoError(e.t, json.Unmarshal(r.Body, &page))
	return page
}

func ids(page httpapi.TenantRunListJSON) []string {
	out := []string{}
	for _, r := range page.Runs {
		out = append(out, r.ID)
	}
	return out
}

func TestTenantRunsAreListedByStatusAndPaged(t *testing.T) {
	e := newEnv(t)
	var done []string
	for _, s := range []string{"s1", "s2", "s1"} {
		run := e.submit(tokenAcme, s, "answer:x")
		e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
		done = append(done, run.ID)
	}
	asking := e.submit(tokenAcme, "s3", "ask:who are you?|answer:ok")
	e.waitStatus(tokenAcme, asking.ID, loop.StatusWaiting)
	all := append(append([]string{}, done...), asking.ID)
	// In the order of the IDs, which begin with the creation time in
	// milliseconds: these share the fake clock's millisecond.
	slices.Sort(all)
	slices.Sort(done)

	page := e.tenantRuns(tokenAcme, "")
	require.Equal(t, all, ids(page))
	require.Empty(t, page.NextAfter)
	w := page.Runs[slices.Index(all, asking.ID)]
	require.Equal(t, loop.StatusWaiting, w.Status)
	require.NotNil(t, w.WaitingSummary)
	require.True(t, w.WaitingSummary.Input)
	require.Equal(t, "s3", w.Session)
	require.Equal(t, "ask:who are you?|answer:ok", w.InputPreview)

	// One status.
	require.Equal(t, []string{asking.ID}, ids(e.tenantRuns(tokenAcme, "?status=waiting")))
	require.Equal(t, done, ids(e.tenantRuns(tokenAcme, "?status=completed")))
	require.Empty(t, e.tenantRuns(tokenAcme, "?status=failed").Runs)

	// Pages: next_after is the last ID of a page that has a next one.
	page = e.tenantRuns(tokenAcme, "?limit=3")
	require.Equal(t, all[:3], ids(page))
	require.Equal(t, all[2], page.NextAfter)
	page = e.tenantRuns(tokenAcme, "?limit=3&after="+page.NextAfter)
	require.Equal(t, all[3:], ids(page))
	require.Empty(t, page.NextAfter)
	page = e.tenantRuns(tokenAcme, "?status=completed&limit=2")
	require.Equal(t, done[:2], ids(page))
	require.Equal(t, done[1], page.NextAfter)
	require.Equal(t, done[2:], ids(e.tenantRuns(tokenAcme, "?status=completed&limit=2&after="+page.NextAfter)))

	// Another tenant sees none of them.
	require.Empty(t, e.tenantRuns(tokenGlobex, "").Runs)
	require.Empty(t, e.tenantRuns(tokenGlobex, "?status=waiting").Runs)

	// Bad queries say what is wrong; no token is 401.
	for _, q := range []string{"?status=done", "?after=not.an.id", "?limit=0", "?limit=501"} {
		r := e.do("GET", "/v1/runs"+q, tokenAcme, "")
		require.Equal(t, http.StatusBadRequest, r.Status, "GET /v1/runs%s: %s", q, r.Body)
		require.Equal(t, httpapi.CodeBadRequest, r.errCode(t))
	}
	require.Contains(t, e.do("GET", "/v1/runs?status=done", tokenAcme, "").message(t), "pending, running, waiting, completed, failed or cancelled")
	require.Equal(t, http.StatusUnauthorized, e.do("GET", "/v1/runs", "", "").Status)
}

// GET /v1/runs?order=newest lists the same Runs backwards: the one
// created last first, with status and agent filters, and pages that go
// on at next_after, before the last Run shown.
func TestTenantRunsAreListedNewestFirstWithOrderNewest(t *testing.T) {
	e := newEnv(t)
	// Created a millisecond apart, so that their IDs are in creation order.
	var created, done []string
	for _, s := range []string{"s1", "s2", "s1", "s2"} {
		run := e.submit(tokenAcme, s, "answer:x")
		e.waitStatus(tokenAcme, run.ID, loop.StatusCompleted)
		created = append(created, run.ID)
		done = append(done, run.ID)
		e.clock.Advance(time.Millisecond)
	}
	asking := e.submit(tokenAcme, "s3", "ask:who are you?|answer:ok")
	e.waitStatus(tokenAcme, asking.ID, loop.StatusWaiting)
	created = append(created, asking.ID)
	require.True(t, slices.IsSorted(created), "IDs in creation order: %v", created)
	newest := slices.Clone(created)
	slices.Reverse(newest)
	slices.Reverse(done)

	// The default, and order=oldest, are oldest first, as before.
	require.Equal(t, created, ids(e.tenantRuns(tokenAcme, "")))
	require.Equal(t, created, ids(e.tenantRuns(tokenAcme, "?order=oldest")))
	page := e.tenantRuns(tokenAcme, "?order=newest")
	require.Equal(t, newest, ids(page))
	require.Empty(t, page.NextAfter)
	require.Equal(t, loop.StatusWaiting, page.Runs[0].Status)

	// Pages: next_after is the last ID shown; the next page is the Runs
	// before it.
	page = e.tenantRuns(tokenAcme, "?order=newest&limit=2")
	require.Equal(t, newest[:2], ids(page))
	require.Equal(t, newest[1], page.NextAfter)
	page = e.tenantRuns(tokenAcme, "?order=newest&limit=2&after="+page.NextAfter)
	require.Equal(t, newest[2:4], ids(page))
	require.Equal(t, newest[3], page.NextAfter)
	page = e.tenantRuns(tokenAcme, "?order=newest&limit=2&after="+page.NextAfter)
	require.Equal(t, newest[4:], ids(page))
	require.Empty(t, page.NextAfter)

	// With a status, and with an agent.
	require.Equal(t, done, ids(e.tenantRuns(tokenAcme, "?order=newest&status=completed")))
	page = e.tenantRuns(tokenAcme, "?order=newest&status=completed&limit=3")
	require.Equal(t, done[:3], ids(page))
	require.Equal(t, done[3:], ids(e.tenantRuns(tokenAcme, "?order=newest&status=completed&limit=3&after="+page.NextAfter)))
	require.Equal(t, []string{asking.ID}, ids(e.tenantRuns(tokenAcme, "?order=newest&status=waiting")))
	require.Equal(t, newest, ids(e.tenantRuns(tokenAcme, "?order=newest&agent=default")))
	require.Empty(t, e.tenantRuns(tokenAcme, "?order=newest&agent=support").Runs)

	// Another tenant sees none of them.
	require.Empty(t, e.tenantRuns(tokenGlobex, "?order=newest").Runs)

	// An order that is neither says which ones there are.
	for _, q := range []string{"?order=desc", "?order=Newest", "?order=newest,oldest"} {
		r := e.do("GET", "/v1/runs"+q, tokenAcme, "")
		require.Equal(t, http.StatusBadRequest, r.Status, "GET /v1/runs%s: %s", q, r.Body)
		require.Equal(t, httpapi.CodeBadRequest, r.errCode(t))
		require.Contains(t, r.message(t), `"order"`)
		require.Contains(t, r.message(t), "oldest (the default) or newest")
	}
}

func TestWhoAmINamesTheTokensTenant(t *testing.T) {
	e := newEnv(t)
	for token, tenant := range map[string]string{tokenAcme: "acme", tokenGlobex: "globex"} {
		r := e.do("GET", "/v1/whoami", token, "")
		require.Equal(t, http.StatusOK, r.Status)
		var who httpapi.WhoAmIJSON
		require.NoError(t, json.Unmarshal(r.Body, &who))
		require.Equal(t, tenant, who.Tenant)
	}
	r := e.do("GET", "/v1/whoami", "nobody's token", "")
	require.Equal(t, http.StatusUnauthorized, r.Status)
	require.Equal(t, httpapi.CodeUnauthorized, r.errCode(t))
}

// A page of GET /v1/runs stays within max_page_bytes, and goes on at
// next_after.
func TestTenantRunsPagesStayWithinTheirBytes(t *testing.T) {
	e := newEnv(t, func(c *httpapi.Config, _ *runtime.Options) { c.MaxPageBytes = 4096 })
	var all []string
	big := strings.Repeat("y", 90)
	for i := 0; i < 12; i++ {
		run := e.submit(tokenAcme, "s1", "answer:"+big)
		all = append(all, run.ID)
	}
	// pagesOf reads every page of the listing in an order.
	pagesOf := func(order string) (got []string, pages int) {
		after := ""
		for {
			q := "?limit=500" + order
			if after != "" {
				q += "&after=" + after
			}
			r := e.do("GET", "/v1/runs"+q, tokenAcme, "")
			require.Equal(t, http.StatusOK, r.Status)
			require.LessOrEqual(t, len(r.Body), 4096, "a page of %d bytes", len(r.Body))
			var page httpapi.TenantRunListJSON
			require.NoError(t, json.Unmarshal(r.Body, &page))
			require.NotEmpty(t, page.Runs)
			got = append(got, ids(page)...)
			pages++
			if page.NextAfter == "" {
				return got, pages
			}
			after = page.NextAfter
		}
	}
	got, pages := pagesOf("")
	// Run IDs begin with their creation time in milliseconds; these share
	// the fake clock's millisecond, so only the IDs tell the order.
	slices.Sort(all)
	require.Equal(t, all, got)
	require.Greater(t, pages, 1, "12 summaries of about 400 bytes fill more than one page of 4096")
	// Newest first, a page cut short by its bytes goes on before its last
	// Run.
	got, pages = pagesOf("&order=newest")
	slices.Reverse(all)
	require.Equal(t, all, got)
	require.Greater(t, pages, 1)
}
