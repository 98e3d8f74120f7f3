package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// Quota bounds what one tenant may have going at once. A zero field means
// no limit.
type Quota struct {
	// MaxActiveRuns bounds the tenant's Runs that are pending, running or
	// waiting; a submission past it answers 429.
	MaxActiveRuns int
	// MaxInFlightEffects bounds the effects of the tenant the runtime is
	// calling, polling or waiting on; a submission at or past it answers
	// 429.
	MaxInFlightEffects int
	// TokenBudget bounds the model tokens (input plus output) all the
	// tenant's Runs may use, ever; once used up, submissions answer 429.
	TokenBudget int64
	// MaxStoredBytes bounds the bytes the tenant's Runs hold in the store
	// (runtime.Store.TenantStoredBytes: their snapshots, event logs and
	// command IDs). Once the tenant holds that much or more, submissions
	// answer 429 until retention prunes ended Runs' logs or the operator
	// raises the quota; a submission whose input and metadata alone are
	// more answers 413, since it could never fit. The figure is read
	// through UsageLedger.StoredBytes, at most StoredBytesMaxAge old, so
	// the tenant may pass the quota by what it writes in that time.
	MaxStoredBytes int64
}

// CodeQuotaStoredBytes is the code of a submission refused by a tenant's
// storage quota (Quota.MaxStoredBytes): 429 when the tenant holds its
// quota, 413 when the submission alone is more than the quota.
const CodeQuotaStoredBytes = "quota_stored_bytes"

// bounded reports whether the quota bounds anything.
func (q Quota) bounded() bool {
	return q.MaxActiveRuns > 0 || q.MaxInFlightEffects > 0 || q.TokenBudget > 0 || q.MaxStoredBytes > 0
}

// activeStatuses are the statuses of a Run that counts against
// MaxActiveRuns.
var activeStatuses = []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting}

// checkQuota refuses a submission that would pass one of the tenant's
// quotas, and reports the refusal to OnLimit under its code. The caller
// holds the tenant's submission lock, so two submissions cannot both take
// the last slot.
func (s *Server) checkQuota(ctx context.Context, tenant string) error {
	return s.countRefusal(tenant, s.checkQuotas(ctx, tenant))
}

// countRefusal reports a quota's refusal (an *apiError) to OnLimit, its
// code naming the quota, and returns err.
func (s *Server) countRefusal(tenant string, err error) error {
	var ae *apiError
	if errors.As(err, &ae) {
		s.cfg.OnLimit(ae.Code, tenant)
	}
	return err
}

func (s *Server) checkQuotas(ctx context.Context, tenant string) error {
	q, ok := s.cfg.Quotas[tenant]
	if !ok {
		return nil
	}
	if q.TokenBudget > 0 {
		used, err := s.cfg.Usage.Used(ctx, s.cfg.Store, tenant)
		if err != nil {
			return fmt.Errorf("httpapi: token usage of tenant %s: %w", tenant, err)
		}
		if used >= q.TokenBudget {
			e := errorf(http.StatusTooManyRequests, CodeQuotaTokens,
				"quota exceeded: token budget: this tenant's Runs have used %d of the %d model tokens (input plus output) its budget allows; ask the operator to raise tenants.%s.quotas.token_budget",
				used, q.TokenBudget, tenant)
			e.RetryAfter = s.cfg.RetryAfter
			return e
		}
	}
	if q.MaxStoredBytes > 0 {
		if err := s.checkStoredBytes(ctx, tenant, q.MaxStoredBytes); err != nil {
			return err
		}
	}
	if q.MaxInFlightEffects > 0 {
		if n := s.cfg.Runtime.InFlight(tenant); n >= q.MaxInFlightEffects {
			e := errorf(http.StatusTooManyRequests, CodeQuotaInFlight,
				"quota exceeded: in-flight effects: this tenant has %d model or tool calls in flight and may have %d; retry after the Retry-After delay, once some finish",
				n, q.MaxInFlightEffects)
			e.RetryAfter = s.cfg.RetryAfter
			return e
		}
	}
	if q.MaxActiveRuns > 0 {
		n := 0
		for _, st := range activeStatuses {
			ids, err := s.cfg.Store.RunsByStatus(ctx, tenant, st, "", q.MaxActiveRuns-n)
			if err != nil {
				return fmt.Errorf("httpapi: count %s runs of tenant %s: %w", st, tenant, err)
			}
			if n += len(ids); n >= q.MaxActiveRuns {
				e := errorf(http.StatusTooManyRequests, CodeQuotaActiveRuns,
					"quota exceeded: active runs: this tenant has %d Runs pending, running or waiting, its limit; retry after the Retry-After delay, or cancel a Run (POST /v1/runs/{id}/cancel)",
					q.MaxActiveRuns)
				e.RetryAfter = s.cfg.RetryAfter
				return e
			}
		}
	}
	return nil
}

// StoredBytesReader is what the storage quota reads; runtime.Store has
// it.
type StoredBytesReader interface {
	TenantStoredBytes(ctx context.Context, tenant string) (int64, error)
}

var _ StoredBytesReader = (runtime.Store)(nil)

// checkStoredBytes answers 429 when the tenant's Runs hold limit bytes or
// more in the store.
func (s *Server) checkStoredBytes(ctx context.Context, tenant string, limit int64) error {
	used, err := s.cfg.Usage.StoredBytes(ctx, s.cfg.Store, tenant)
	if err != nil {
		return fmt.Errorf("httpapi: stored bytes of tenant %s: %w", tenant, err)
	}
	if used < limit {
		return nil
	}
	e := errorf(http.StatusTooManyRequests, CodeQuotaStoredBytes,
		"quota exceeded: stored bytes: this tenant's Runs hold %d bytes in the store (snapshots, event logs and command IDs), and its quota is %d bytes; "+
			"nothing needs deleting: where retention is set, it frees the event logs of ended Runs as it prunes them, so retry after the Retry-After delay, "+
			"or ask the operator to raise tenants.%s.quotas.max_stored_bytes",
		used, limit, tenant)
	e.RetryAfter = s.cfg.RetryAfter
	return e
}

// checkSubmissionFits answers 413 when a submission could never fit the
// tenant's storage quota: its input and metadata alone are more than the
// quota, and a Run holds both (in its snapshot and its first event, at
// least). It reads nothing, so it is checked before the tenant's other
// quotas and without its submission lock.
func (s *Server) checkSubmissionFits(tenant string, req SubmitRequest) error {
	limit := s.cfg.Quotas[tenant].MaxStoredBytes
	if n := submissionBytes(req); limit > 0 && n > limit {
		return s.countRefusal(tenant, errorf(http.StatusRequestEntityTooLarge, CodeQuotaStoredBytes,
			"quota exceeded: stored bytes: this submission's input and metadata are %d bytes, more than the %d bytes this tenant's Runs may hold in the store in all, so it could never be stored; "+
				"send a smaller input or less metadata, or ask the operator to raise tenants.%s.quotas.max_stored_bytes",
			n, limit, tenant))
	}
	return nil
}

// submissionBytes is what a submission brings that its Run will hold: its
// input and its metadata.
func submissionBytes(req SubmitRequest) int64 {
	return int64(len(req.Input) + len(req.Metadata))
}

// StoredBytesMaxAge is how old a tenant's stored bytes may be when
// UsageLedger.StoredBytes hands them out. A burst of submissions reads
// the store once in that time, not once each (on PostgreSQL the figure is
// a sum over the tenant's runs rows), and may therefore pass the quota by
// what the tenant writes in that time.
const StoredBytesMaxAge = time.Second

// UsageLedger keeps each tenant's usage for its quotas: the model tokens
// of its Runs, for token budgets, and the bytes its Runs hold in the
// store, for the storage quota. It is a runtime.Observer (only Usage
// matters to it): give it to the runtime, with the metrics observer,
// through an observer tee.
//
// A tenant's token figure starts from the Runs in the store: Seed reads
// them once, and a tenant not seeded is seeded on first use; from then on
// the runtime's reports keep it current. Seed before the runtime starts
// for an exact figure: a seed that races commits may count those commits
// twice (never miss one), which errs on the side of the budget.
//
// The stored bytes are read from the store, at most once every
// StoredBytesMaxAge per tenant (StoredBytes).
//
// UsageLedger is safe for concurrent use.
type UsageLedger struct {
	runtime.NopObserver

	// Clock is what the stored-bytes figures age by; nil means the system
	// clock. Set it before the ledger is used.
	Clock runtime.Clock

	mu      sync.Mutex
	tenants map[string]*tenantUsage
}

// tenantUsage is one tenant's figures. Before its seed starts, the
// runtime's reports are ignored: the seed reads them from the store.
// From the moment the seed starts they are added, so a commit the seed's
// scan also reads is counted twice, never missed.
type tenantUsage struct {
	seedMu   sync.Mutex // held while the tenant is seeded
	counting bool       // reports are added (the seed has started)
	seeded   bool
	tokens   int64

	storedMu sync.Mutex // held while the stored bytes are read
	stored   int64      // the stored bytes as read at storedAt
	storedAt time.Time  // zero before the first read
}

var _ runtime.Observer = (*UsageLedger)(nil)

// NewUsageLedger returns an empty ledger.
func NewUsageLedger() *UsageLedger { return &UsageLedger{tenants: map[string]*tenantUsage{}} }

func (l *UsageLedger) tenant(id string) *tenantUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.tenants[id]
	if t == nil {
		t = &tenantUsage{}
		l.tenants[id] = t
	}
	return t
}

// Usage implements runtime.Observer.
func (l *UsageLedger) Usage(tenant string, u abi.Usage) {
	t := l.tenant(tenant)
	l.mu.Lock()
	if t.counting {
		t.tokens += u.InputTokens + u.OutputTokens
	}
	l.mu.Unlock()
}

// RunLister is what the ledger reads to seed a tenant: the Runs by status.
type RunLister interface {
	RunsByStatus(ctx context.Context, tenant string, status loop.Status, after string, limit int) ([]string, error)
	LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error)
}

var allStatuses = []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting,
	loop.StatusCompleted, loop.StatusFailed, loop.StatusCancelled}

// seedPage is how many Run IDs one seeding read asks for.
const seedPage = 500

// Seed reads the token usage of every Run of the tenants from the store.
// It reads every Run once; call it before the runtime starts.
func (l *UsageLedger) Seed(ctx context.Context, store RunLister, tenants ...string) error {
	for _, id := range tenants {
		if _, err := l.Used(ctx, store, id); err != nil {
			return err
		}
	}
	return nil
}

// Used returns the tokens the tenant's Runs have used, seeding the tenant
// from the store first if it was not.
func (l *UsageLedger) Used(ctx context.Context, store RunLister, tenant string) (int64, error) {
	t := l.tenant(tenant)
	t.seedMu.Lock()
	defer t.seedMu.Unlock()
	if !t.seeded {
		l.mu.Lock()
		t.counting, t.tokens = true, 0
		l.mu.Unlock()
		stored, err := storedUsage(ctx, store, tenant)
		l.mu.Lock()
		if err != nil {
			t.counting = false
			l.mu.Unlock()
			return 0, err
		}
		t.tokens += stored
		t.seeded = true
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return t.tokens, nil
}

// StoredBytes returns the bytes the tenant's Runs hold in the store, as
// read from store at most StoredBytesMaxAge ago by the ledger's clock. A
// nil ledger reads the store every time.
func (l *UsageLedger) StoredBytes(ctx context.Context, store StoredBytesReader, tenant string) (int64, error) {
	if l == nil {
		return store.TenantStoredBytes(ctx, tenant)
	}
	clock := l.Clock
	if clock == nil {
		clock = runtime.SystemClock{}
	}
	t := l.tenant(tenant)
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	now := clock.Now()
	if age := now.Sub(t.storedAt); !t.storedAt.IsZero() && age >= 0 && age < StoredBytesMaxAge {
		return t.stored, nil
	}
	n, err := store.TenantStoredBytes(ctx, tenant)
	if err != nil {
		return 0, err
	}
	t.stored, t.storedAt = n, now
	return n, nil
}

func storedUsage(ctx context.Context, store RunLister, tenant string) (int64, error) {
	var sum int64
	for _, st := range allStatuses {
		after := ""
		for {
			ids, err := store.RunsByStatus(ctx, tenant, st, after, seedPage)
			if err != nil {
				return 0, fmt.Errorf("httpapi: seed token usage of tenant %s: %w", tenant, err)
			}
			for _, id := range ids {
				run, err := store.LoadRun(ctx, tenant, id)
				if err != nil {
					return 0, fmt.Errorf("httpapi: seed token usage of tenant %s: run %s: %w", tenant, id, err)
				}
				sum += run.Usage.InputTokens + run.Usage.OutputTokens
			}
			if len(ids) < seedPage {
				break
			}
			after = ids[len(ids)-1]
		}
	}
	return sum, nil
}

// retryAfterDefault is the Retry-After of a 429 or 503 when the Config
// sets none.
const retryAfterDefault = 5 * time.Second
