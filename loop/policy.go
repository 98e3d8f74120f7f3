package loop

import (
	"fmt"
	"hash/fnv"
	"strconv"
)

func (p Policy) check() error {
	switch p.Mode {
	case PolicyRetry:
		if p.MaxAttempts < 1 {
			return fmt.Errorf("retry needs max_attempts >= 1, got %d", p.MaxAttempts)
		}
		if p.BackoffMS < 0 || p.MaxBackoffMS < 0 || p.MaxRetryAfterMS < 0 {
			return fmt.Errorf("backoff must not be negative")
		}
		if p.MaxRateLimitedAttempts < 0 {
			return fmt.Errorf("max_rate_limited_attempts must not be negative, got %d", p.MaxRateLimitedAttempts)
		}
	case PolicyFail, PolicyFailRun:
	default:
		return fmt.Errorf("unknown mode %q (want retry, fail or fail_run)", p.Mode)
	}
	return nil
}

// Backoff is the wait before attempt+1 of an effect whose attempt failed
// under policy p: BackoffMS doubled per attempt, capped at MaxBackoffMS
// (when set), plus a jitter of up to a quarter of it. The jitter is a hash
// of the effect ID and attempt, not a random number, so the Loop stays
// deterministic and two processes compute the same instant.
func Backoff(p Policy, effectID string, attempt int) int64 {
	if p.BackoffMS <= 0 {
		return 0
	}
	d := p.BackoffMS
	for i := 1; i < attempt && d < 1<<40; i++ {
		d *= 2
	}
	if p.MaxBackoffMS > 0 && d > p.MaxBackoffMS {
		d = p.MaxBackoffMS
	}
	h := fnv.New64a()
	h.Write([]byte(effectID))
	h.Write([]byte("#" + strconv.Itoa(attempt)))
	if q := d / 4; q > 0 {
		d += int64(h.Sum64() % uint64(q+1))
	}
	return d
}

// RetryWait is the wait before attempt+1 of an effect whose attempt
// failed with f under policy p: the Backoff, or f's RetryAfterMS when it
// is longer, up to p's RetryAfterCapMS. A provider's retry_after within
// the cap is thus never cut: no attempt goes earlier than it asked. One
// beyond the cap waits the cap (max_backoff does not cut it: it bounds
// the policy's own backoff).
func RetryWait(p Policy, effectID string, attempt int, f *Failure) int64 {
	d := Backoff(p, effectID, attempt)
	if f != nil && f.RetryAfterMS > 0 {
		d = max(d, min(f.RetryAfterMS, p.RetryAfterCapMS()))
	}
	return d
}

// retryAllowed reports whether policy p dispatches effect e again after
// its current attempt failed with f, a retriable failure that e's
// counters (Failures, RateLimited) already include: a rate-limited
// failure while fewer than the rate-limited budget failed so, any other
// while fewer than MaxAttempts attempts were not rate-limited.
func retryAllowed(p Policy, e *Effect, f *Failure) bool {
	if p.Mode != PolicyRetry {
		return false
	}
	if f.RateLimited() {
		return e.RateLimited < p.RateLimitedAttempts()
	}
	return e.Attempt-e.RateLimited < p.MaxAttempts
}
