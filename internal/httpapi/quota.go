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
	// command IDs). Each submission, answer and approval request is
	// weighed before it is accepted: what the tenant holds, plus what the
	// writes accepted before it will add and the figure does not show yet
	// (their reservations), plus the most this one adds
	// (SubmissionStoredBytes, InputStoredBytes), must fit the quota, or it
	// answers 429 until retention prunes ended Runs' logs or the operator
	// raises the quota; one that could not fit even an empty quota answers
	// 413. Cancellations are never refused by it. What a Run writes later
	// on its own (the model's answers, tool results, the requests of later
	// model steps) is counted once it is stored, not reserved in advance.
	MaxStoredBytes int64
}

// CodeQuotaStoredBytes is the code of a submission, answer or approval
// request refused by a tenant's storage quota (Quota.MaxStoredBytes): 429
// when it does not fit beside what the tenant holds and has reserved, 413
// when it alone is more than the quota.
const CodeQuotaStoredBytes = "quota_stored_bytes"

// bounded reports whether the quota bounds anything.
func (q Quota) bounded() bool {
	return q.MaxActiveRuns > 0 || q.MaxInFlightEffects > 0 || q.TokenBudget > 0 || q.MaxStoredBytes > 0
}

// activeStatuses are the statuses of a Run that counts against
// MaxActiveRuns.
var activeStatuses = []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting}

// checkQuota refuses a submission of up to stored bytes
// (SubmissionStoredBytes) that would pass one of the tenant's quotas, and
// reports the refusal to OnLimit under its code. The caller holds the
// tenant's submission lock, so two submissions cannot both take the last
// slot. It returns the reservation of the submission's bytes under the
// storage quota (nil when the tenant has none), which the caller settles
// once the submission is made (settleReservation).
func (s *Server) checkQuota(ctx context.Context, tenant string, stored int64) (*Reservation, error) {
	res, err := s.checkQuotas(ctx, tenant, stored)
	return res, s.countRefusal(tenant, err)
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

func (s *Server) checkQuotas(ctx context.Context, tenant string, stored int64) (*Reservation, error) {
	q, ok := s.tenants().quotas[tenant]
	if !ok {
		return nil, nil
	}
	if q.TokenBudget > 0 {
		used, err := s.cfg.Usage.Used(ctx, s.cfg.Store, tenant)
		if err != nil {
			return nil, fmt.Errorf("httpapi: token usage of tenant %s: %w", tenant, err)
		}
		if used >= q.TokenBudget {
			e := errorf(http.StatusTooManyRequests, CodeQuotaTokens,
				"quota exceeded: token budget: this tenant's Runs have used %d of the %d model tokens (input plus output) its budget allows; ask the operator to raise tenants.%s.quotas.token_budget",
				used, q.TokenBudget, tenant)
			e.RetryAfter = s.cfg.RetryAfter
			return nil, e
		}
	}
	// The reservation is taken in the order the quotas are checked, and
	// given back if a later one refuses.
	res, err := s.reserveStoredBytes(ctx, tenant, stored, submissionWrite)
	if err != nil {
		return nil, err
	}
	if err := s.checkActivity(ctx, tenant, q); err != nil {
		res.Cancel()
		return nil, err
	}
	return res, nil
}

// checkActivity refuses a submission past the tenant's bounds on effects
// in flight and on active Runs.
func (s *Server) checkActivity(ctx context.Context, tenant string, q Quota) error {
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

// A write the storage quota weighs, for its messages.
type quotaWrite struct {
	noun string // "submission", "answer", "approval request"
	fix  string // what to send instead of one that could never fit
	// more is advice for a write refused for now, besides waiting and
	// asking the operator.
	more string
}

var (
	submissionWrite = quotaWrite{noun: "submission", fix: "send a smaller input or less metadata"}
	answerWrite     = quotaWrite{noun: "answer", fix: "send a shorter message",
		more: "; a Run you no longer need can be cancelled (POST /v1/runs/{id}/cancel), which this quota never refuses"}
	approvalWrite = quotaWrite{noun: "approval request", fix: "send shorter reasons, or fewer approvals in one request",
		more: "; a Run you no longer need can be cancelled (POST /v1/runs/{id}/cancel), which this quota never refuses"}
)

// checkWriteFits answers 413 when a write of up to n bytes could never
// fit the tenant's storage quota, even with nothing else stored. It reads
// nothing, so it is checked before the tenant's other quotas and without
// its submission lock. what says what the write is made of, for the
// message ("its input and metadata are 20001 bytes").
func (s *Server) checkWriteFits(tenant string, n int64, w quotaWrite, what string) error {
	limit := s.tenants().quotas[tenant].MaxStoredBytes
	if limit <= 0 || n <= limit {
		return nil
	}
	return s.countRefusal(tenant, errorf(http.StatusRequestEntityTooLarge, CodeQuotaStoredBytes,
		"quota exceeded: stored bytes: this %s's %s, which the store keeps several times over (up to %d bytes with the records that carry them), "+
			"more than the %d bytes this tenant's Runs may hold in the store in all, so it could never be stored; "+
			"%s, or ask the operator to raise tenants.%s.quotas.max_stored_bytes",
		w.noun, what, n, limit, w.fix, tenant))
}

// reserveStoredBytes lets a write of up to n bytes through the tenant's
// storage quota, reserving them, or answers 429: what the tenant's Runs
// hold (read through the ledger, at most StoredBytesMaxAge old), plus
// what earlier writes reserved and the figure does not show yet, plus n,
// must fit the quota. It returns nil, and reserves nothing, when the
// tenant has no storage quota. The caller settles the reservation once
// the write is made (settleReservation).
func (s *Server) reserveStoredBytes(ctx context.Context, tenant string, n int64, w quotaWrite) (*Reservation, error) {
	limit := s.tenants().quotas[tenant].MaxStoredBytes
	if limit <= 0 {
		return nil, nil
	}
	res, held, reserved, err := s.cfg.Usage.ReserveStoredBytes(ctx, s.cfg.Store, tenant, n, limit)
	if err != nil {
		return nil, fmt.Errorf("httpapi: stored bytes of tenant %s: %w", tenant, err)
	}
	if res != nil {
		return res, nil
	}
	pending := ""
	if reserved > 0 {
		pending = fmt.Sprintf(", writes accepted a moment ago will add up to %d more", reserved)
	}
	e := errorf(http.StatusTooManyRequests, CodeQuotaStoredBytes,
		"quota exceeded: stored bytes: this tenant's Runs hold %d bytes in the store (snapshots, event logs and command IDs)%s, this %s would add up to %d, and its quota is %d bytes; "+
			"nothing needs deleting: where retention is set, it frees the event logs of ended Runs as it prunes them, so retry after the Retry-After delay%s, "+
			"or ask the operator to raise tenants.%s.quotas.max_stored_bytes",
		held, pending, w.noun, n, limit, w.more, tenant)
	e.RetryAfter = s.cfg.RetryAfter
	return nil, e
}

// reserveInput weighs an answer or an approval request against the
// tenant's storage quota (413 or 429 as reserveStoredBytes), and returns
// its reservation, to settle once it is written.
func (s *Server) reserveInput(ctx context.Context, tenant string, req InputRequest) (*Reservation, error) {
	if s.tenants().quotas[tenant].MaxStoredBytes <= 0 {
		return nil, nil
	}
	n := InputStoredBytes(req)
	w, what := approvalWrite, ""
	if req.Message != nil {
		w, what = answerWrite, fmt.Sprintf("message is %d bytes", len(*req.Message))
	} else {
		reasons := 0
		for _, a := range req.Approvals {
			reasons += len(a.Reason)
		}
		what = fmt.Sprintf("reasons are %d bytes (%d decisions)", reasons, len(req.Approvals))
	}
	if err := s.checkWriteFits(tenant, n, w, what); err != nil {
		return nil, err
	}
	res, err := s.reserveStoredBytes(ctx, tenant, n, w)
	return res, s.countRefusal(tenant, err)
}

// settleReservation settles the reservation of a write once it is made:
// a write that certainly stored nothing (refused by the Loop or the
// runtime before it was committed, or a replayed submission) gives its
// bytes back at once; any other, successful or not (a store error may
// come after the commit), keeps them until the tenant's figure is next
// read from the store.
func settleReservation(res *Reservation, err error, wroteNothing bool) {
	if wroteNothing || refusedBeforeWriting(err) {
		res.Cancel()
		return
	}
	res.Landed()
}

// refusedBeforeWriting reports whether err is a refusal that wrote
// nothing.
func refusedBeforeWriting(err error) bool {
	if err == nil {
		return false
	}
	var ae *apiError
	return errors.As(err, &ae) ||
		errors.Is(err, runtime.ErrRunNotFound) || errors.Is(err, runtime.ErrRunChanged) || errors.Is(err, runtime.ErrRunExists) ||
		errors.Is(err, loop.ErrTerminal) || errors.Is(err, loop.ErrNotAwaiting) || errors.Is(err, loop.ErrUnknownToolCall) ||
		errors.Is(err, loop.ErrInvalidEvent) || errors.Is(err, loop.ErrNoChange) || errors.Is(err, loop.ErrInvalidID)
}

// checkSubmissionFits answers 413 when a submission could never fit the
// tenant's storage quota: the most it stores (SubmissionStoredBytes) is
// more than the quota.
func (s *Server) checkSubmissionFits(tenant string, req SubmitRequest, n int64) error {
	return s.checkWriteFits(tenant, n, submissionWrite,
		fmt.Sprintf("input and metadata are %d bytes", submissionBytes(req)))
}

// submissionBytes is what a submission brings that its Run will hold: its
// input and its metadata.
func submissionBytes(req SubmitRequest) int64 {
	return int64(len(req.Input) + len(req.Metadata))
}

// What a write stores besides the strings the tenant sent, as the
// storage quota reckons it: the records' framing, IDs and times, and for
// a submission its Run's spec (limits, policies, the tenant's tools) and
// the rest of its first model step's request (the builder's prompt and
// tool descriptions). A one-step Run of the tests' seven scripted tools
// holds about 3.9 KiB besides its input. A tenant whose tools or prompt
// are larger has Runs that hold more than submissionOverheadBytes of
// them: those bytes are the operator's, not the tenant's, and are counted
// once stored.
const (
	submissionOverheadBytes = 4 << 10
	inputOverheadBytes      = 1 << 10
	approvalOverheadBytes   = 256 // each decision's record and the denial's wording
)

// StoredBytesBound is the most bytes the store keeps for a string a
// tenant sends, as the storage quota reckons it when it weighs a write:
// twice as it is, in the Run's snapshot (a submission's input is in its
// spec and in its first message; a denial's reason, an answer, a
// cancellation's reason are in it once or twice), and twice as JSON (the
// event that records it, and the request of the next model step, which
// holds the transcript), where a byte takes up to 6 (a control character
// as \u0001; the stores write JSON without encoding/json's HTML escapes,
// runcodec.MarshalJSON, so <, > and & take one). For plain text, code and
// HTML that is 4 bytes a byte. Later model steps store the transcript
// again in their requests, and the session's later Runs in theirs (as
// history): those copies are counted when they are stored, not here.
func StoredBytesBound(s string) int64 { return 2*int64(len(s)) + 2*jsonStringBytes(s) }

// SubmissionStoredBytes is the most a submission stores up to its first
// model step, as the storage quota weighs it: its input and metadata
// (StoredBytesBound each), its Idempotency-Key (kept as the creation
// command's ID, twice), and an allowance for the Run's records.
func SubmissionStoredBytes(req SubmitRequest, idempotencyKey string) int64 {
	return submissionOverheadBytes + StoredBytesBound(req.Input) + StoredBytesBound(string(req.Metadata)) + 2*int64(len(idempotencyKey))
}

// InputStoredBytes is the most an answer or an approval request stores,
// as the storage quota weighs it: its message, or each decision's reason
// (StoredBytesBound) and tool call ID, and an allowance for the records.
func InputStoredBytes(req InputRequest) int64 {
	n := int64(inputOverheadBytes)
	if req.Message != nil {
		n += StoredBytesBound(*req.Message)
	}
	for _, a := range req.Approvals {
		n += approvalOverheadBytes + 2*jsonStringBytes(a.ToolCallID) + StoredBytesBound(a.Reason)
	}
	return n
}

// jsonStringBytes is the most bytes s takes as a JSON string, quotes
// included, as runcodec.MarshalJSON writes it: a quote or a backslash as
// two bytes; control characters as up to six (\u0001); U+2028 and U+2029
// (three bytes) as six; anything else, <, > and & too, as it is.
func jsonStringBytes(s string) int64 {
	n := int64(2)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20:
			n += 6
		case c == '"' || c == '\\':
			n += 2
		case c == 0xE2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xA8 || s[i+2] == 0xA9):
			n += 6
			i += 2
		default:
			n++
		}
	}
	return n
}

// StoredBytesMaxAge is how old a tenant's stored bytes may be when
// UsageLedger.StoredBytes hands them out. A burst of submissions reads
// the store once in that time, not once each (on PostgreSQL the figure is
// a sum over the tenant's runs rows); the writes let through meanwhile
// are counted by their reservations (UsageLedger.ReserveStoredBytes)
// until a read of the store holds them.
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
// StoredBytesMaxAge per tenant (StoredBytes); the writes the storage
// quota lets through hold reservations until a read holds them
// (ReserveStoredBytes).
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

	storedMu sync.Mutex // held while the stored bytes are read, and a write weighed against them
	stored   int64      // the stored bytes as read at storedAt
	storedAt time.Time  // zero before the first read

	// Under UsageLedger.mu: the reservations of writes let through by the
	// storage quota and not yet in stored, and the reads of the store
	// begun, which tell which landed reservations a read sees.
	reserved int64          // the bytes of the reservations not released
	reads    uint64         // reads of the stored bytes begun
	landed   []*Reservation // landed, until a read begun after them
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
	t := l.tenant(tenant)
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	return l.storedLocked(ctx, store, t, tenant)
}

// storedLocked is StoredBytes with t.storedMu held. A read of the store
// releases the reservations that landed before it began: the figure it
// reads holds their writes.
func (l *UsageLedger) storedLocked(ctx context.Context, store StoredBytesReader, t *tenantUsage, tenant string) (int64, error) {
	clock := l.Clock
	if clock == nil {
		clock = runtime.SystemClock{}
	}
	now := clock.Now()
	if age := now.Sub(t.storedAt); !t.storedAt.IsZero() && age >= 0 && age < StoredBytesMaxAge {
		return t.stored, nil
	}
	l.mu.Lock()
	t.reads++
	read := t.reads
	l.mu.Unlock()
	n, err := store.TenantStoredBytes(ctx, tenant)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	kept := t.landed[:0]
	for _, r := range t.landed {
		if r.landedAt < read {
			t.reserved -= r.n
		} else {
			kept = append(kept, r)
		}
	}
	clear(t.landed[len(kept):])
	t.landed = kept
	l.mu.Unlock()
	t.stored, t.storedAt = n, now
	return n, nil
}

// ReserveStoredBytes weighs a write of up to n bytes against the tenant's
// storage quota of limit bytes: what the tenant's Runs hold (as
// StoredBytes reads it), plus what the writes let through before reserved
// and that figure does not show yet, plus n. If that fits, it reserves n
// and returns the reservation, which the caller settles once the write is
// made (Reservation.Landed, or Cancel if it wrote nothing); otherwise it
// returns nil, reserving nothing. Either way it returns the figures it
// weighed, held and reserved. Weighing and reserving are one step for the
// tenant, so writes made at once cannot all take the same room. The
// reservations are this ledger's: each node keeps its own, and sees the
// others' writes once they are stored. l must not be nil.
func (l *UsageLedger) ReserveStoredBytes(ctx context.Context, store StoredBytesReader, tenant string, n, limit int64) (res *Reservation, held, reserved int64, err error) {
	t := l.tenant(tenant)
	t.storedMu.Lock()
	defer t.storedMu.Unlock()
	held, err = l.storedLocked(ctx, store, t, tenant)
	if err != nil {
		return nil, 0, 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	reserved = t.reserved
	if held+reserved+n > limit {
		return nil, held, reserved, nil
	}
	t.reserved += n
	return &Reservation{l: l, t: t, n: n}, held, reserved, nil
}

// ReservedStoredBytes returns the bytes reserved for the tenant's writes
// and not yet released.
func (l *UsageLedger) ReservedStoredBytes(tenant string) int64 {
	t := l.tenant(tenant)
	l.mu.Lock()
	defer l.mu.Unlock()
	return t.reserved
}

// A Reservation is room in a tenant's storage quota held for a write the
// quota let through (UsageLedger.ReserveStoredBytes), until the tenant's
// stored bytes, read from the store, hold the write. Its methods may be
// called on nil (a write no storage quota weighed), and only the first
// call counts.
type Reservation struct {
	l        *UsageLedger
	t        *tenantUsage
	n        int64
	done     bool   // Landed or Cancel was called
	landedAt uint64 // the reads of the store begun when it landed
}

// Landed says the write is in the store, or may be (a store error may
// come after the commit): the reservation is released by the first read
// of the tenant's stored bytes begun from now on, whose figure holds it.
func (r *Reservation) Landed() {
	if r == nil {
		return
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.done {
		return
	}
	r.done, r.landedAt = true, r.t.reads
	r.t.landed = append(r.t.landed, r)
}

// Cancel says the write stored nothing: the reservation is released now.
func (r *Reservation) Cancel() {
	if r == nil {
		return
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	r.t.reserved -= r.n
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
				own := run.OwnUsage() // a child's tokens are its own Run's, not its parent's too
				sum += own.InputTokens + own.OutputTokens
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
