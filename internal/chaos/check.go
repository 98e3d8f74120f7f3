package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/agenthost/agenthost/loop"
)

// The invariants a crash leaves intact (docs/DESIGN.md §9) are checked
// over each Run's event log, as the store holds it after the server
// stopped, by loop.LogCheck: the chaos harness, bench recovery and
// TestServeSurvivesKill9 share it. What needs more than the log (the
// slow-job plugin's own execution counts, in its KV) is checked here.

// chaosAnswer is the user's answer the chaos clients give to a question
// a Run asks: derived from the question, so that the log shows which
// question each input answered.
func chaosAnswer(prompt string) string { return "re: " + prompt }

// chaosCheckLog checks the log of a Run the chaos clients followed to its
// end: loop's rules, each input the clients' answer to the question of
// its moment (chaosAnswer), and the Run ended.
func chaosCheckLog(evs []loop.Event) []string {
	return loop.LogCheck{Ended: true, Answer: chaosAnswer}.Check(evs)
}

// KVReader reads a plugin's key/value space: any runtime.Store (Badger's,
// PostgreSQL's) has it.
type KVReader interface {
	KVGet(ctx context.Context, tenant, plugin string, key []byte) ([]byte, error)
}

// slowJobTool is the slow-job plugin's tool.
const slowJobTool = "slow_job"

// CheckSlowJobs checks the slow_job calls among a Run's effects (recs,
// from loop.LogEffects) against the slow-job plugin's own KV (plugin ID
// plugin, of tenant): each slow_job attempt ran at most once, that
// no attempt ran that was never dispatched, and that an attempt settled
// as finished ran exactly once. It returns the number of slow_job effects
// checked.
func CheckSlowJobs(ctx context.Context, store KVReader, tenant, plugin string, recs map[string]*loop.EffectHistory) (int, []string, error) {
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
func slowJobExecutions(ctx context.Context, store KVReader, tenant, plugin, effect string, attempt int) (int, error) {
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
