package node

import (
	"context"
	"testing"

	"github.com/agenthost/agenthost/internal/config"
)

// TestRetiredIsForgottenOnceClosed: what retire closed after its drain
// is no longer held.
func TestRetiredIsForgottenOnceClosed(t *testing.T) {
	s := &System{}
	closed := make(chan struct{})
	s.retire(0, func(context.Context) error { close(closed); return nil })
	<-closed // retire forgets it before it closes it
	s.retiredMu.Lock()
	defer s.retiredMu.Unlock()
	if len(s.retired) != 0 {
		t.Fatalf("%d retired entries are still held after their close", len(s.retired))
	}
}

// TestCommitReloadSwapsTheAPIAroundTheRuntime: the step before the swap
// (the API drops the removed tenants' tokens) sees the runtime's tenants
// of before the reload, the step after it (the API takes the added
// tenants' tokens) those of the reload, both in the one step.
func TestCommitReloadSwapsTheAPIAroundTheRuntime(t *testing.T) {
	s := &System{cfg: &config.Config{}, tenants: &liveTenants{}}
	old, next := &tenantsBuilt{}, &tenantsBuilt{}
	s.tenants.now.Store(old)
	var before, after *tenantsBuilt
	s.commitReload(&reloadBuild{cfg: &config.Config{}, tenants: next},
		func() { before = s.tenants.now.Load() }, func() { after = s.tenants.now.Load() })
	if before != old || after != next {
		t.Fatalf("the API's steps saw the runtime's tenants %p and %p; want the old %p, then the new %p", before, after, old, next)
	}
}
