package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/runtime"
)

// The rates of these tests refill once in a thousand seconds: a test
// spends the burst and meets the limit, whatever the machine's speed.
const slowRefill = 0.001

func withLimits(tenant string, l httpapi.TenantLimits) envOption {
	return func(c *httpapi.Config, _ *runtime.Options) {
		if c.Limits == nil {
			c.Limits = map[string]httpapi.TenantLimits{}
		}
		c.Limits[tenant] = l
	}
}

// limitsSeen records the OnLimit calls.
type limitsSeen struct {
	mu   sync.Mutex
	seen []string
}

func (l *limitsSeen) option(next func(string, string)) envOption {
	return func(c *httpapi.Config, _ *runtime.Options) {
		c.OnLimit = func(limit, tenant string) {
			l.mu.Lock()
			l.seen = append(l.seen, limit+"/"+tenant)
			l.mu.Unlock()
			if next != nil {
				next(limit, tenant)
			}
		}
	}
}

func (l *limitsSeen) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

func TestATenantsRequestsPastItsRateAnswer429AndOthersAreServed(t *testing.T) {
	var seen limitsSeen
	e := newEnv(t, withLimits("acme", httpapi.TenantLimits{Requests: httpapi.Rate{PerSecond: slowRefill, Burst: 3}}), seen.option(nil))
	for i := 0; i < 3; i++ {
		r := e.do("GET", "/v1/runs/run_missing", tokenAcme, "")
		require.Equal(t, http.StatusNotFound, r.Status, "request %d is within the burst", i+1)
	}
	r := e.do("GET", "/v1/runs/run_missing", tokenAcme, "")
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, httpapi.CodeRateLimited, r.errCode(t))
	require.Contains(t, string(r.Body), "rate_limits.requests")
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	// Another tenant has a rate of its own (none here).
	for i := 0; i < 10; i++ {
		require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/runs/run_missing", tokenGlobex, "").Status)
	}
	require.Equal(t, []string{"request_rate/acme"}, seen.all())
}

func TestSubmissionsPastTheirRateAnswer429WhileReadsGoOn(t *testing.T) {
	e := newEnv(t, withLimits("acme", httpapi.TenantLimits{Submissions: httpapi.Rate{PerSecond: slowRefill, Burst: 2}}),
		func(c *httpapi.Config, _ *runtime.Options) { c.OnLimit = nil })
	run := e.submit(tokenAcme, "s1", "answer:one")
	e.submit(tokenAcme, "s1", "answer:two")
	r := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, `{"input": "answer:three"}`)
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, httpapi.CodeRateLimited, r.errCode(t))
	require.Contains(t, string(r.Body), "rate_limits.submissions")
	require.Equal(t, http.StatusOK, e.do("GET", "/v1/runs/"+run.ID, tokenAcme, "").Status)
	require.Equal(t, http.StatusCreated, e.do("POST", "/v1/sessions/s1/runs", tokenGlobex, `{"input": "answer:x"}`).Status)
}

// blockingPages holds acme's SessionRuns calls until released.
type blockingPages struct {
	httpapi.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockingPages) SessionRuns(ctx context.Context, tenant, session string, after int64, limit int) ([]runtime.SessionRun, error) {
	if tenant == "acme" {
		b.entered <- struct{}{}
		<-b.release
	}
	return b.Store.SessionRuns(ctx, tenant, session, after, limit)
}

func TestReadsPastATenantsConcurrencyQuotaAnswer429(t *testing.T) {
	pages := &blockingPages{entered: make(chan struct{}, 8), release: make(chan struct{})}
	var seen limitsSeen
	e := newEnv(t, withLimits("acme", httpapi.TenantLimits{MaxConcurrentReads: 2}), seen.option(nil),
		func(c *httpapi.Config, _ *runtime.Options) { pages.Store = c.Store; c.Store = pages })
	held := make(chan reply, 2)
	for i := 0; i < 2; i++ {
		go func() { held <- e.do("GET", "/v1/sessions/s1/runs", tokenAcme, "") }()
		<-pages.entered
	}
	r := e.do("GET", "/v1/runs/run_missing", tokenAcme, "")
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, httpapi.CodeConcurrentReads, r.errCode(t))
	require.Contains(t, string(r.Body), "quotas.max_concurrent_reads")
	// Globex has its own slots.
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/sessions/s1/runs", tokenGlobex, "").Status)
	close(pages.release)
	for i := 0; i < 2; i++ {
		require.Equal(t, http.StatusNotFound, (<-held).Status)
	}
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/runs/run_missing", tokenAcme, "").Status, "the slots are free again")
	require.Equal(t, []string{"max_concurrent_reads/acme"}, seen.all())
}

func TestRequestsWithoutAValidTokenPastTheAddressRateAnswer429(t *testing.T) {
	var seen limitsSeen
	e := newEnv(t, seen.option(nil), func(c *httpapi.Config, _ *runtime.Options) {
		c.UnauthenticatedRate = httpapi.Rate{PerSecond: slowRefill, Burst: 2}
	})
	for i := 0; i < 2; i++ {
		r := e.do("GET", "/v1/runs/r1", "wrong-token", "")
		require.Equal(t, http.StatusUnauthorized, r.Status)
	}
	r := e.do("POST", "/v1/sessions/s1/runs", "", `{"input": "x"}`)
	require.Equal(t, http.StatusTooManyRequests, r.Status)
	require.Equal(t, httpapi.CodeRateLimited, r.errCode(t))
	require.True(t, strings.Contains(string(r.Body), "http.unauthenticated_rate"), "%s", r.Body)
	require.NotEmpty(t, r.Header.Get("Retry-After"))
	// A valid token from the same address is not charged to that rate.
	require.Equal(t, http.StatusNotFound, e.do("GET", "/v1/runs/run_missing", tokenAcme, "").Status)
	require.Equal(t, []string{"unauthenticated_rate/"}, seen.all())
}
