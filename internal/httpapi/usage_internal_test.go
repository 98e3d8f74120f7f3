package httpapi

import (
	"context"
	"testing"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
)

// runsByStatus is a RunLister over a fixed set of Runs.
type runsByStatus map[string]loop.Run

func (m runsByStatus) RunsByStatus(_ context.Context, _ string, st loop.Status, after string, _ int) ([]string, error) {
	var ids []string
	for id, r := range m {
		if r.Status == st && id > after {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

func (m runsByStatus) LoadRun(_ context.Context, _, id string) (loop.Run, error) { return m[id], nil }

// TestTheSeededTokenCountCountsAChildOnce: a parent's Usage includes its
// child's, which the child's own Run holds too; the tenant's count, read
// from the store at start, adds each Run's own usage, so the child's
// tokens count once.
func TestTheSeededTokenCountCountsAChildOnce(t *testing.T) {
	child := abi.Usage{InputTokens: 30, OutputTokens: 7}
	runs := runsByStatus{
		"parent": {Status: loop.StatusCompleted, Usage: abi.Usage{InputTokens: 50, OutputTokens: 12}, ChildrenUsage: child},
		"sub-1":  {Status: loop.StatusCompleted, Usage: child},
		"other":  {Status: loop.StatusRunning, Usage: abi.Usage{InputTokens: 1, OutputTokens: 1}},
	}
	got, err := storedUsage(context.Background(), runs, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(20 + 5 + 30 + 7 + 2); got != want {
		t.Fatalf("the tenant's tokens read as %d, want %d (the child's once)", got, want)
	}
}
