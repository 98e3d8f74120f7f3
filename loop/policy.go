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
		if p.BackoffMS < 0 || p.MaxBackoffMS < 0 {
			return fmt.Errorf("backoff must not be negative")
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
