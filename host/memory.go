package host

import (
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// memoryBudget is the host-wide cap on the linear memory of every live
// instance (Config.MaxInstanceMemory). It counts the bytes of linear
// memory the guests have grown to, not Go's slack behind them.
type memoryBudget struct {
	limit int64
	used  atomic.Int64

	// busy counts the pool instances serving a call, host-wide, and freed
	// is closed (then replaced) whenever one of them is released: a call
	// that found no room under the cap waits for it (Host.waitForRoom).
	mu    sync.Mutex
	busy  int
	freed chan struct{}
}

// lent counts an instance handed to a call.
func (b *memoryBudget) lent() {
	b.mu.Lock()
	b.busy++
	b.mu.Unlock()
}

// returned counts an instance given back (kept idle, where it can be
// evicted, or closed) and wakes the calls waiting for room.
func (b *memoryBudget) returned() {
	b.mu.Lock()
	b.busy--
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// watch returns the number of busy instances and a channel closed when
// one of them is returned.
func (b *memoryBudget) watch() (busy int, freed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	return b.busy, b.freed
}

// reserve takes n bytes from the budget if they fit.
func (b *memoryBudget) reserve(n int64) bool {
	for {
		cur := b.used.Load()
		if cur+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (b *memoryBudget) release(n int64) { b.used.Add(-n) }

// instanceMemory is the wazero memory allocator of one instance: it backs
// the guest's memory and the Extism kernel's, caps each at limit bytes,
// charges every grow to the host budget, and remembers a refused grow, so
// that a failed call can be classified plugin_oom. The per-plugin cap is
// enforced here rather than with wazero's WithMemoryLimitPages, because a
// grow refused by wazero itself is invisible to the host (RATIONALE.md).
type instanceMemory struct {
	budget   *memoryBudget
	limit    uint64
	refused  atomic.Bool
	peak     atomic.Uint64
	mu       sync.Mutex
	memories int // linear memories allocated through this allocator
}

var _ experimental.MemoryAllocator = (*instanceMemory)(nil)

// Allocate implements experimental.MemoryAllocator.
func (m *instanceMemory) Allocate(_, _ uint64) experimental.LinearMemory {
	m.mu.Lock()
	m.memories++
	m.mu.Unlock()
	return &linearMemory{owner: m}
}

func (m *instanceMemory) allocated() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.memories
}

// linearMemory is one capped linear memory.
type linearMemory struct {
	owner   *instanceMemory
	buf     []byte
	charged int64
	started bool
}

// Reallocate implements experimental.LinearMemory. It returns nil (the
// guest's memory.grow fails) past the instance's cap or the host budget.
// The first call, the memory's declared minimum, is always granted:
// wazero cannot fail an instantiation from here, and the host checked the
// budget before it instantiated.
func (l *linearMemory) Reallocate(size uint64) []byte {
	if size <= uint64(len(l.buf)) {
		return l.buf[:size]
	}
	o := l.owner
	if l.started && size > o.limit {
		o.refused.Store(true)
		return nil
	}
	delta := int64(size) - l.charged
	if !l.started {
		o.budget.used.Add(delta)
	} else if !o.budget.reserve(delta) {
		o.refused.Store(true)
		return nil
	}
	l.started = true
	l.charged = int64(size)
	if size > o.peak.Load() {
		o.peak.Store(size)
	}
	if size <= uint64(cap(l.buf)) {
		l.buf = l.buf[:size]
		return l.buf
	}
	newCap := max(size, min(2*uint64(cap(l.buf)), o.limit))
	nb := make([]byte, size, newCap)
	copy(nb, l.buf)
	l.buf = nb
	return l.buf
}

// Free implements experimental.LinearMemory.
func (l *linearMemory) Free() {
	l.owner.budget.release(l.charged)
	l.charged = 0
	l.buf = nil
}
