package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/badgerstore"
	"github.com/agenthost/agenthost/loop"
)

// The invariants a crash leaves intact (docs/DESIGN.md §9), checked over a Run's
// event log as the store holds it after the server stopped. The chaos
// bench and TestServeSurvivesKill9 (a test of package main, hence the
// exported names) share them; each check returns the violations it found,
// one sentence each.

// CheckEventLog checks one Run's log: sequence numbers 1..n with no gap,
// one terminal event and it last, and no effect attempt settled twice.
func CheckEventLog(runID string, evs []loop.Event) []string {
	if len(evs) == 0 {
		return []string{fmt.Sprintf("run %s has no events", runID)}
	}
	var out []string
	settled := map[string]int{}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			out = append(out, fmt.Sprintf("run %s: event %d has seq %d", runID, i+1, ev.Seq))
		}
		if ev.Terminal() && i != len(evs)-1 {
			out = append(out, fmt.Sprintf("run %s: terminal event %s at seq %d is not the last (%d)", runID, ev.Type, ev.Seq, len(evs)))
		}
		if ev.Type == loop.EventEffectSettled {
			k := fmt.Sprintf("%s#%d", ev.EffectID, ev.Attempt)
			if settled[k]++; settled[k] > 1 {
				out = append(out, fmt.Sprintf("run %s: effect %s settled twice", runID, k))
			}
		}
	}
	if last := evs[len(evs)-1]; !last.Terminal() {
		out = append(out, fmt.Sprintf("run %s: the last event is %s, not terminal", runID, last.Type))
	}
	return out
}

// chaosAnswer is the user's answer the chaos clients give to a question
// a Run asks: derived from the question, so that the log shows which
// question each input answered.
func chaosAnswer(prompt string) string { return "re: " + prompt }

// checkInputs checks the user inputs in one Run's log: each answers the
// question the Run was waiting on (the last model step's await_input), and
// only once. A Run that completed had every question answered.
func checkInputs(runID string, evs []loop.Event) []string {
	var out []string
	asked := ""
	for _, ev := range evs {
		switch {
		case ev.Type == loop.EventEffectSettled && ev.Outcome != nil && ev.Outcome.Model != nil && ev.Outcome.Model.AwaitInput != nil:
			asked = ev.Outcome.Model.AwaitInput.Prompt
		case ev.Type == loop.EventInputProvided:
			switch {
			case asked == "":
				out = append(out, fmt.Sprintf("run %s: input %q at seq %d answers no open question", runID, ev.Input, ev.Seq))
			case ev.Input != chaosAnswer(asked):
				out = append(out, fmt.Sprintf("run %s: input %q at seq %d does not answer the open question %q", runID, ev.Input, ev.Seq, asked))
			}
			asked = ""
		case ev.Type == loop.EventRunCompleted && asked != "":
			out = append(out, fmt.Sprintf("run %s completed at seq %d with the question %q unanswered", runID, ev.Seq, asked))
		}
	}
	return out
}

// EffectRecord is one effect of a Run as its log tells it.
type EffectRecord struct {
	ID         string
	Kind       string // "model" or "tool"
	Tool       string // the tool a tool effect calls ("" if the log does not say)
	Dispatched int    // the highest attempt dispatched
	Settled    map[int]*loop.Outcome
}

// EffectRecords reads every effect of a Run's log: its kind, the tool it
// calls (from the tool calls of the model step that asked for it), its
// attempts dispatched and its settlements by attempt.
func EffectRecords(evs []loop.Event) map[string]*EffectRecord {
	recs := map[string]*EffectRecord{}
	get := func(id string) *EffectRecord {
		r := recs[id]
		if r == nil {
			r = &EffectRecord{ID: id, Settled: map[int]*loop.Outcome{}}
			if ref, err := loop.ParseEffectID(id); err == nil {
				r.Kind = ref.Kind
			}
			recs[id] = r
		}
		return r
	}
	for _, ev := range evs {
		if ev.EffectID == "" {
			continue
		}
		switch ev.Type {
		case loop.EventEffectDispatched:
			r := get(ev.EffectID)
			r.Dispatched = max(r.Dispatched, ev.Attempt)
		case loop.EventEffectSettled:
			get(ev.EffectID).Settled[ev.Attempt] = ev.Outcome
		}
	}
	// A model step that settled done names the tools of its calls: tool
	// call i of step s is effect <run>.t<s>.<i>.
	for _, r := range recs {
		ref, err := loop.ParseEffectID(r.ID)
		if err != nil || ref.Kind != "model" {
			continue
		}
		for _, o := range r.Settled {
			if o == nil || o.State != loop.OutcomeDone || o.Model == nil {
				continue
			}
			for i, c := range o.Model.Message.ToolCalls {
				if t := recs[loop.ToolEffectID(ref.Run, ref.Step, i)]; t != nil {
					t.Tool = c.Name
				}
			}
		}
	}
	return recs
}

// maxAttempts is how many attempts a missing-effect policy allows: retry
// allows its MaxAttempts, fail and fail_run one.
func maxAttempts(p loop.Policy) int {
	if p.Mode == loop.PolicyRetry && p.MaxAttempts > 0 {
		return p.MaxAttempts
	}
	return 1
}

// checkPolicies checks that no effect was dispatched more attempts than
// its policy allows, with the policies of the Run's spec.
func checkPolicies(runID string, spec *loop.Spec, recs map[string]*EffectRecord) []string {
	if spec == nil {
		return []string{fmt.Sprintf("run %s: no run_created event with the Run's spec", runID)}
	}
	var out []string
	for _, r := range recs {
		var p loop.Policy
		switch r.Kind {
		case "model":
			p = spec.ModelPolicy
		case "tool":
			if r.Tool == "" {
				out = append(out, fmt.Sprintf("run %s: effect %s: no model step names its tool", runID, r.ID))
				continue
			}
			p = loop.DefaultToolPolicy(false)
			for _, t := range spec.Tools {
				if t.Name == r.Tool {
					p = t.Policy
				}
			}
		default:
			out = append(out, fmt.Sprintf("run %s: effect %s has a malformed ID", runID, r.ID))
			continue
		}
		if limit := maxAttempts(p); r.Dispatched > limit {
			out = append(out, fmt.Sprintf("run %s: effect %s (%s %s) dispatched %d attempts; its policy (%s) allows %d",
				runID, r.ID, r.Kind, r.Tool, r.Dispatched, p.Mode, limit))
		}
	}
	return out
}

// slowJobTool is the slow-job plugin's tool.
const slowJobTool = "slow_job"

// CheckSlowJobs checks, from the slow-job plugin's own KV (plugin ID
// plugin, of tenant), that each slow_job attempt ran at most once, that
// no attempt ran that was never dispatched, and that an attempt settled
// as finished ran exactly once. It returns the number of slow_job effects
// checked.
func CheckSlowJobs(ctx context.Context, store *badgerstore.Store, tenant, plugin string, recs map[string]*EffectRecord) (int, []string, error) {
	jobs := 0
	var out []string
	for _, r := range recs {
		if r.Kind != "tool" || r.Tool != slowJobTool || r.Dispatched == 0 {
			continue
		}
		jobs++
		for a := 1; a <= r.Dispatched+1; a++ {
			n, err := slowJobExecutions(ctx, store, tenant, plugin, r.ID, a)
			if err != nil {
				return jobs, out, err
			}
			switch {
			case n > 1:
				out = append(out, fmt.Sprintf("%s#%d: the slow job ran %d times", r.ID, a, n))
			case a > r.Dispatched && n != 0:
				out = append(out, fmt.Sprintf("%s#%d: a slow job ran for an attempt never dispatched", r.ID, a))
			}
			if o := r.Settled[a]; o != nil && o.State == loop.OutcomeDone && o.Tool != nil && strings.Contains(o.Tool.Content, "finished") && n != 1 {
				out = append(out, fmt.Sprintf("%s#%d settled done (%s) but the plugin recorded %d executions, want 1", r.ID, a, o.Tool.Content, n))
			}
		}
	}
	return jobs, out, nil
}

// slowJobExecutions reads how many times the slow-job plugin created the
// job of an effect attempt, from its KV. The plugin writes the job's
// record (which carries the count as "exec") first and the exec/… counter
// second; a kill between the two leaves the counter behind until a
// repeated start repairs it, and recovery reattaches (attach, poll)
// without a start. So the count is the larger of the two.
func slowJobExecutions(ctx context.Context, store *badgerstore.Store, tenant, plugin, effect string, attempt int) (int, error) {
	n := 0
	exec := fmt.Sprintf("exec/%s#%d", effect, attempt)
	v, err := store.KVGet(ctx, tenant, plugin, []byte(exec))
	if err != nil {
		return 0, fmt.Errorf("kv %s: %w", exec, err)
	}
	if v != nil {
		if n, err = strconv.Atoi(string(v)); err != nil {
			return 0, fmt.Errorf("kv %s = %q: %w", exec, v, err)
		}
	}
	job := fmt.Sprintf("job/%s#%d", effect, attempt)
	if v, err = store.KVGet(ctx, tenant, plugin, []byte(job)); err != nil {
		return 0, fmt.Errorf("kv %s: %w", job, err)
	}
	if v != nil {
		var rec struct {
			Exec int `json:"exec"`
		}
		if err := json.Unmarshal(v, &rec); err != nil {
			return 0, fmt.Errorf("kv %s = %q: %w", job, v, err)
		}
		n = max(n, rec.Exec)
	}
	return n, nil
}
