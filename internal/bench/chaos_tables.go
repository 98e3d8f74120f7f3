package bench

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agenthost/agenthost/internal/chaos"
	"github.com/agenthost/agenthost/internal/config"
)

// chaosTables is the human-readable summary.
func chaosTables(res *chaos.Result) []table {
	header := []string{"kills", "pauses", "graceful restarts"}
	row := []string{strconv.Itoa(res.Kills), strconv.Itoa(res.Pauses), strconv.Itoa(res.Restarts)}
	if res.Store == config.DriverPostgres {
		header = append(header, "PostgreSQL restarts", "pauses past the lease", "partitions", "lease-lost exits", "slowest lease given up after a partition (ms)")
		row = append(row, strconv.Itoa(res.PgRestarts), strconv.Itoa(res.PausesPastLease), strconv.Itoa(res.Partitions), strconv.Itoa(res.LeaseLostExits),
			fmt.Sprintf("%.0f", res.MaxLeaseGivenUpMS))
	}
	header = append(header, "slowest ready after restart (ms)", "slowest answer after SIGCONT (ms)", "slowest exit after SIGTERM (ms)", "submission retries", "client errors", "of which during pauses")
	row = append(row, fmt.Sprintf("%.0f", res.MaxReadyMS), fmt.Sprintf("%.0f", res.MaxResumMS),
		fmt.Sprintf("%.0f", res.MaxExitMS), strconv.FormatInt(res.Retries, 10), strconv.FormatInt(res.ClientErrors, 10), strconv.FormatInt(res.PauseErrors, 10))
	faults := table{Title: "Faults", Header: header, Rows: [][]string{row},
		Notes: []string{fmt.Sprintf("seed %d; %d node(s) on %s; %.0f s in all, of which %.0f s draining; approvals answered: %d yes, %d no; questions answered: %d; cancellations asked: %d",
			res.Seed, res.Nodes, res.Store, res.ElapsedS, res.DrainS, res.Approved, res.Denied, res.Answered, res.Cancels)}}
	statuses := []string{"completed", "failed", "cancelled", "pending", "running", "waiting"}
	runs := table{Title: "Runs", Header: append([]string{"kind", "acknowledged"}, statuses...)}
	for _, k := range append(append([]string(nil), chaos.Kinds()...), "total") {
		var byStatus map[string]int
		if k == "total" {
			byStatus = map[string]int{"acknowledged": res.Acknowledged}
			for s, n := range res.ByStatus {
				byStatus[s] = n
			}
		} else {
			byStatus = res.Kinds[k]
		}
		row := []string{k, strconv.Itoa(byStatus["acknowledged"])}
		for _, s := range statuses {
			row = append(row, strconv.Itoa(byStatus[s]))
		}
		runs.Rows = append(runs.Rows, row)
	}
	st := res.Streams
	runs.Notes = []string{fmt.Sprintf("%d submissions started, %d acknowledged; %d ended otherwise than their kind usually does", res.Submitted, res.Acknowledged, len(res.UnusualEnds)),
		fmt.Sprintf("event streams: %d opened (%d on a node other than the one that acknowledged the Run), %d events, %d Runs followed to their end; resumed elsewhere: %d cut off, %d silent, %d behind the store",
			st.Opened, st.CrossNode, st.Events, st.Followed, st.Broken, st.Idle, st.Stale)}
	for _, u := range firstN(res.UnusualEnds, 10) {
		runs.Notes = append(runs.Notes, "  "+u)
	}
	effects := countTable("Effects", []string{"settled", "attempts"}, res.EffectsSettled)
	effects.Notes = []string{fmt.Sprintf("%d attempts dispatched; %d slow jobs checked against the plugin's execution counts", res.Dispatched, res.SlowJobs)}
	recovery := countTable("Recovery", []string{"decision", "count"}, res.Recovery)
	recovery.Notes = []string{fmt.Sprintf("%d sessions taken over from a killed or stopped node; %d watchdog reports", res.SessionsTaken, res.Watchdog)}
	out := []table{faults, runs, effects, recovery}
	if res.Takeovers != nil {
		out = append(out, chaosTakeoverTables(res.Takeovers)...)
	}
	if res.Store == config.DriverPostgres {
		out = append(out, chaosPgRestartTable(res.PgRestartFigures))
	}
	verdict := table{Title: fmt.Sprintf("Violations: %d", len(res.Violations)), Header: []string{"#", "violation"}}
	for i, v := range res.Violations {
		verdict.Rows = append(verdict.Rows, []string{strconv.Itoa(i + 1), v})
	}
	if len(res.Violations) == 0 {
		verdict.Header, verdict.Notes = nil, []string{"every invariant held"}
	}
	return append(out, verdict)
}

// chaosPgRestartTable is one row per PostgreSQL restart.
func chaosPgRestartTable(rs []chaos.PgRestart) table {
	t := table{Title: "PostgreSQL restarts", Header: []string{"at (s)", "pg_ctl restart -m immediate (ms)", "clients' error window (s)", "failed requests", "lease-lost exits"}}
	var worst float64
	for _, r := range rs {
		t.Rows = append(t.Rows, []string{fmt.Sprintf("%.1f", r.AtS), fmt.Sprintf("%.0f", r.RestartMS), fmt.Sprintf("%.2f", r.ErrorWindowS), strconv.Itoa(r.Failed), strconv.Itoa(r.LeaseLost)})
		worst = max(worst, r.ErrorWindowS)
	}
	if len(rs) == 0 {
		t.Header, t.Notes = nil, []string{"none"}
		return t
	}
	t.Notes = []string{fmt.Sprintf("the error window runs from the restart's beginning to the last request that failed (a transport error or a 5xx) before they succeeded again; the longest: %.2f s", worst)}
	return t
}

// countTable is a table of counts by name, sorted by name.
func countTable(title string, header []string, counts map[string]int) table {
	t := table{Title: title, Header: header}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.Rows = append(t.Rows, []string{k, strconv.Itoa(counts[k])})
	}
	return t
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(append([]string(nil), s[:n]...), fmt.Sprintf("… and %d more", len(s)-n))
	}
	return s
}

// chaosTakeoverTables are the takeover figures, per node and per kind of
// death.
func chaosTakeoverTables(rep *chaos.TakeoverReport) []table {
	t := table{Title: fmt.Sprintf("Takeovers (lease TTL %s)", time.Duration(rep.LeaseTTLS*float64(time.Second))),
		Header: []string{"deaths of", "kills", "pauses past the lease", "lost leases", "sessions taken over", "first takeover ×TTL (median / max)", "all taken over ×TTL (median / max)"}}
	row := func(s chaos.TakeoverSummary) []string {
		return []string{s.Name, strconv.Itoa(s.Kills), strconv.Itoa(s.PausesPast), strconv.Itoa(s.LeaseLosses), strconv.Itoa(s.Sessions),
			fmt.Sprintf("%.2f / %.2f", s.FirstMedian, s.FirstMax), fmt.Sprintf("%.2f / %.2f", s.AllMedian, s.AllMax)}
	}
	for _, s := range rep.Nodes {
		t.Rows = append(t.Rows, row(s))
	}
	for _, s := range rep.Kinds {
		t.Rows = append(t.Rows, row(s))
	}
	t.Rows = append(t.Rows, row(rep.All))
	t.Notes = []string{fmt.Sprintf("the deaths whose sessions were taken over, timed from the SIGKILL, the SIGSTOP, the partition or the PostgreSQL restart to the first and the last \"recovery: session taken over\" naming the dead incarnation; slowest: all taken over %.1f s after the death",
		rep.All.AllMaxSeconds),
		fmt.Sprintf("%d kills left no session with a live Run to take over; %d sessions released by graceful stops claimed", rep.KillsWithout, rep.Released)}
	if len(rep.Other) > 0 {
		t.Notes = append(t.Notes, fmt.Sprintf("%d takeovers of an owner no death explains: %s", len(rep.Other), strings.Join(firstN(rep.Other, 5), "; ")))
	}
	return []table{t}
}
