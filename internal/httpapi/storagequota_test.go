package httpapi_test

import (
	"context"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// withLedgerClock makes the usage ledger age its stored-bytes figures by
// the test's FakeClock.
func withLedgerClock() envOption {
	return func(c *httpapi.Config, o *runtime.Options) { c.Usage.Clock = o.Clock }
}

// bigInput is a submission body whose input is n bytes.
func bigInput(n int) string {
	return `{"input": "answer:` + strings.Repeat("x", n-len("answer:")) + `"}`
}

// TestStorageQuotaRefusesATenantThatHoldsItsQuota fills a tenant's
// storage quota with one big submission: once its figure is read again,
// every submission of that tenant answers 429, while another tenant with
// the same quota still submits.
func TestStorageQuotaRefusesATenantThatHoldsItsQuota(t *testing.T) {
	const quota = 20_000
	q := httpapi.Quota{MaxStoredBytes: quota}
	e := newEnv(t, withQuota("acme", q), withQuota("globex", q), withLedgerClock())

	// acme holds nothing yet: the first fits (the most it stores up to
	// its first model step, 4 bytes an input byte and an allowance, is
	// within the quota), and once the scripted model has answered with
	// the whole input, its Run holds the input 10 times: past the quota.
	r := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, bigInput(3_000))
	require.Equal(t, http.StatusCreated, r.Status, "body: %s", r.Body)
	e.waitStatus(tokenAcme, r.run(t).ID, loop.StatusCompleted)
	held, err := e.store.TenantStoredBytes(context.Background(), "acme")
	require.NoError(t, err)
	require.GreaterOrEqual(t, held, int64(quota))

	// Once the figure is read again, acme is at its quota: big or small,
	// its submissions are refused, and nothing of them is stored.
	e.clock.Advance(httpapi.StoredBytesMaxAge)
	for _, body := range []string{bigInput(3_000), `{"input": "answer:x"}`} {
		r = e.do("POST", "/v1/sessions/s2/runs", tokenAcme, body)
		require.Equal(t, http.StatusTooManyRequests, r.Status, "body: %s", r.Body)
		require.Equal(t, httpapi.CodeQuotaStoredBytes, r.errCode(t))
		require.NotEmpty(t, r.Header.Get("Retry-After"))
		msg := r.message(t)
		require.Contains(t, msg, "quota exceeded: stored bytes")
		require.Contains(t, msg, "its quota is 20000 bytes")
		require.Contains(t, msg, "tenants.acme.quotas.max_stored_bytes")
		m := regexp.MustCompile(`Runs hold (\d+) bytes`).FindStringSubmatch(msg)
		require.NotNil(t, m, "the message names the tenant's usage: %s", msg)
		used, _ := strconv.ParseInt(m[1], 10, 64)
		require.GreaterOrEqual(t, used, int64(quota))
	}
	runs, err := e.store.SessionRuns(context.Background(), "acme", "s2", 0, 0)
	require.NoError(t, err)
	require.Empty(t, runs, "a refused submission stored a Run")

	// globex has a quota of its own, and acme's Runs do not count in it.
	e.submit(tokenGlobex, "s1", "answer:"+strings.Repeat("y", 3_000))
}

// countingStore counts the reads of the tenants' stored bytes.
type countingStore struct {
	httpapi.Store
	inner httpapi.StoredBytesReader
	reads atomic.Int64
}

func (c *countingStore) TenantStoredBytes(ctx context.Context, tenant string) (int64, error) {
	c.reads.Add(1)
	return c.inner.TenantStoredBytes(ctx, tenant)
}

// TestStorageQuotaReadsTheStoreOnceASecondPerTenant submits a burst: the
// tenant's stored bytes are read from the store once per
// StoredBytesMaxAge, not once per submission, and each tenant's apart.
func TestStorageQuotaReadsTheStoreOnceASecondPerTenant(t *testing.T) {
	q := httpapi.Quota{MaxStoredBytes: 1 << 30}
	cs := &countingStore{}
	e := newEnv(t, withQuota("acme", q), withQuota("globex", q), withLedgerClock(), func(c *httpapi.Config, _ *runtime.Options) {
		cs.Store, cs.inner = c.Store, c.Store.(httpapi.StoredBytesReader)
		c.Store = cs
	})
	for i := range 5 {
		e.submit(tokenAcme, "s"+strconv.Itoa(i), "answer:x")
	}
	require.Equal(t, int64(1), cs.reads.Load(), "a burst of 5 submissions read the stored bytes this often")
	e.clock.Advance(httpapi.StoredBytesMaxAge - time.Millisecond)
	e.submit(tokenAcme, "s5", "answer:x")
	require.Equal(t, int64(1), cs.reads.Load(), "a figure younger than StoredBytesMaxAge was read again")
	e.clock.Advance(time.Millisecond)
	e.submit(tokenAcme, "s6", "answer:x")
	require.Equal(t, int64(2), cs.reads.Load(), "a figure StoredBytesMaxAge old was not read again")
	e.submit(tokenGlobex, "s1", "answer:x")
	require.Equal(t, int64(3), cs.reads.Load(), "another tenant's figure is its own")
}

// TestStorageQuotaRefusesASubmissionThatCouldNeverFit sends submissions
// whose input, or metadata, alone is more than the tenant's storage
// quota: 413, not to be retried, and nothing stored; one that fits goes
// through.
func TestStorageQuotaRefusesASubmissionThatCouldNeverFit(t *testing.T) {
	const quota = 20_000
	e := newEnv(t, withQuota("acme", httpapi.Quota{MaxStoredBytes: quota}), withLedgerClock())
	tooBig := map[string]string{
		"input":    bigInput(quota + 1),
		"metadata": `{"input": "answer:x", "metadata": {"blob": "` + strings.Repeat("m", quota) + `"}}`,
	}
	for what, body := range tooBig {
		r := e.do("POST", "/v1/sessions/s1/runs", tokenAcme, body)
		require.Equal(t, http.StatusRequestEntityTooLarge, r.Status, "%s: body: %s", what, r.Body)
		require.Equal(t, httpapi.CodeQuotaStoredBytes, r.errCode(t))
		require.Empty(t, r.Header.Get("Retry-After"), "a submission that could never fit is not to be retried")
		msg := r.message(t)
		require.Contains(t, msg, "more than the 20000 bytes this tenant's Runs may hold")
		require.Contains(t, msg, "could never be stored")
		require.Contains(t, msg, "tenants.acme.quotas.max_stored_bytes")
	}
	require.Contains(t, e.do("POST", "/v1/sessions/s1/runs", tokenAcme, tooBig["input"]).message(t), "input and metadata are 20001 bytes")
	held, err := e.store.TenantStoredBytes(context.Background(), "acme")
	require.NoError(t, err)
	require.Zero(t, held, "a refused submission stored something")
	e.submit(tokenAcme, "s1", "answer:"+strings.Repeat("x", 3_000))
}
