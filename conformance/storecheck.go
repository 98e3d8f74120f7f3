package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

// allStatuses lists every Run status, for index checks.
var allStatuses = []loop.Status{loop.StatusPending, loop.StatusRunning, loop.StatusWaiting,
	loop.StatusCompleted, loop.StatusFailed, loop.StatusCancelled}

// CheckIndexes reads every index of a tenant's sessions through the Store
// port and reports the first disagreement with the snapshots: session
// ordinals not 1…n, ActiveRuns not the non-terminal Runs in session order,
// ExecutingEffects not the executing effects of the snapshots, RunsByStatus
// not the Runs with that status, RunsByStatusDesc not them backwards. sessions must name every session of the
// tenant that holds a Run. Crash tests call it after reopening a store.
func CheckIndexes(ctx context.Context, s runtime.Store, tenant string, sessions []string) error {
	byStatus := map[loop.Status][]string{}
	for _, session := range sessions {
		runs, err := s.SessionRuns(ctx, tenant, session, 0, 0)
		if err != nil {
			return fmt.Errorf("session runs of %s/%s: %w", tenant, session, err)
		}
		var wantActive []string
		var wantExec []runtime.EffectRecord
		for i, sr := range runs {
			if sr.Ordinal != int64(i+1) {
				return fmt.Errorf("session %s/%s: run %s has ordinal %d at position %d", tenant, session, sr.Run.ID, sr.Ordinal, i+1)
			}
			if sr.Run.Session != session || sr.Run.Tenant != tenant {
				return fmt.Errorf("session %s/%s lists run %s of %s/%s", tenant, session, sr.Run.ID, sr.Run.Tenant, sr.Run.Session)
			}
			loaded, err := s.LoadRun(ctx, tenant, sr.Run.ID)
			if err != nil {
				return fmt.Errorf("load run %s/%s listed by its session: %w", tenant, sr.Run.ID, err)
			}
			if !sameJSON(loaded, sr.Run) {
				return fmt.Errorf("run %s/%s: SessionRuns and LoadRun disagree", tenant, sr.Run.ID)
			}
			byStatus[sr.Run.Status] = append(byStatus[sr.Run.Status], sr.Run.ID)
			if !sr.Run.Status.Terminal() {
				wantActive = append(wantActive, fmt.Sprintf("%s@%d", sr.Run.ID, sr.Run.Seq))
			}
			wantExec = append(wantExec, runtime.ExecutingRecords(sr.Run)...)
		}
		active, err := s.ActiveRuns(ctx, tenant, session)
		if err != nil {
			return fmt.Errorf("active runs of %s/%s: %w", tenant, session, err)
		}
		var gotActive []string
		for _, r := range active {
			gotActive = append(gotActive, fmt.Sprintf("%s@%d", r.ID, r.Seq))
		}
		if fmt.Sprint(gotActive) != fmt.Sprint(wantActive) {
			return fmt.Errorf("active runs of %s/%s: index says %v, snapshots say %v", tenant, session, gotActive, wantActive)
		}
		exec, err := s.ExecutingEffects(ctx, tenant, session)
		if err != nil {
			return fmt.Errorf("executing effects of %s/%s: %w", tenant, session, err)
		}
		sortEffects(exec)
		sortEffects(wantExec)
		if fmt.Sprint(exec) != fmt.Sprint(wantExec) {
			return fmt.Errorf("executing effects of %s/%s: index says %v, snapshots say %v", tenant, session, exec, wantExec)
		}
	}
	for _, st := range allStatuses {
		got, err := s.RunsByStatus(ctx, tenant, st, "", 0)
		if err != nil {
			return fmt.Errorf("runs of %s by status %s: %w", tenant, st, err)
		}
		want := byStatus[st]
		sort.Strings(want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("runs of %s with status %s: index says %v, snapshots say %v", tenant, st, got, want)
		}
		desc, err := s.RunsByStatusDesc(ctx, tenant, st, "", 0)
		if err != nil {
			return fmt.Errorf("runs of %s by status %s, descending: %w", tenant, st, err)
		}
		slices.Reverse(desc)
		if fmt.Sprint(desc) != fmt.Sprint(want) {
			return fmt.Errorf("runs of %s with status %s: the index read backwards says %v reversed, snapshots say %v", tenant, st, desc, want)
		}
	}
	return nil
}

func sortEffects(e []runtime.EffectRecord) {
	sort.Slice(e, func(i, j int) bool {
		if e[i].RunID != e[j].RunID {
			return e[i].RunID < e[j].RunID
		}
		return e[i].EffectID < e[j].EffectID
	})
}

// sameJSON reports whether a and b encode to the same JSON: the equality a
// store's round-trip preserves.
func sameJSON(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}
