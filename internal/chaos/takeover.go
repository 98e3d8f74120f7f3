package chaos

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// With several nodes on one store, the sessions of a node that dies (a
// SIGKILL, or a SIGSTOP past its lease) pass to another once its lease
// has run out at the store: a recovery pass (every 10 s, on each node)
// claims them and logs "recovery: session taken over" with the dead
// owner's node ID. The harness times each death to the first takeover of
// the dead incarnation's sessions and to the last, as multiples of the
// lease TTL, from the nodes' logs.

// Death is the end of a node incarnation that the takeovers of its
// sessions are timed from.
type Death struct {
	Node int    `json:"node"`
	Kind string `json:"kind"` // kill; pause (past the lease, or one it lost its lease in); partition (from PostgreSQL); lease_lost (an exit for a lost lease no fault explains); term
	// Owner is the dead incarnation's node ID, the dead_owner of the
	// takeovers.
	Owner  string  `json:"node_id"`
	AtS    float64 `json:"at_s"` // since the run began
	PauseS float64 `json:"pause_s,omitempty"`

	Sessions int     `json:"sessions_taken_over"`
	FirstS   float64 `json:"first_takeover_s,omitempty"`
	AllS     float64 `json:"all_taken_over_s,omitempty"`
	FirstTTL float64 `json:"first_takeover_lease_ttls,omitempty"`
	AllTTL   float64 `json:"all_taken_over_lease_ttls,omitempty"`
	Takers   []int   `json:"taken_over_by,omitempty"` // the nodes that took them

	at          time.Time
	first, last time.Time
	sessions    map[string]bool
	takers      map[int]bool
}

// chaosTakeover is one "recovery: session taken over" line of a node's
// log.
type chaosTakeover struct {
	at                                time.Time
	taker, deadOwner, tenant, session string
}

// chaosLeaseLost is the kind of death of a node that exited for a lost
// lease no fault explains.
const chaosLeaseLost = "lease_lost"

// TakeoverSummary sums up the deaths of a node (or of a kind, or all)
// whose sessions were taken over, for the table and --json.
type TakeoverSummary struct {
	Name string `json:"name"` // "node N", a kind of death, or "all"
	// Deaths counts the deaths whose sessions were taken over: Kills,
	// PausesPast (a pause past the lease) and LeaseLosses (an exit for a
	// lost lease after a PostgreSQL restart or a partition from it, or
	// that no fault explains).
	Deaths        int     `json:"deaths"`
	Kills         int     `json:"kills"`
	PausesPast    int     `json:"pauses_past_the_lease"`
	LeaseLosses   int     `json:"lease_losses"`
	Sessions      int     `json:"sessions_taken_over"`
	FirstMedian   float64 `json:"first_takeover_median_lease_ttls"`
	FirstMax      float64 `json:"first_takeover_max_lease_ttls"`
	AllMedian     float64 `json:"all_taken_over_median_lease_ttls"`
	AllMax        float64 `json:"all_taken_over_max_lease_ttls"`
	AllMaxSeconds float64 `json:"all_taken_over_max_s"`
}

// TakeoverReport is what the run found about takeovers.
type TakeoverReport struct {
	LeaseTTLS float64           `json:"lease_ttl_s"`
	Deaths    []Death           `json:"deaths"`
	Nodes     []TakeoverSummary `json:"by_node"`
	Kinds     []TakeoverSummary `json:"by_kind"`
	All       TakeoverSummary   `json:"all"`
	// KillsWithout counts the kills that left no session with a live Run
	// behind.
	KillsWithout int `json:"kills_without_takeovers"`
	// Released counts the sessions taken over that no node owned: those a
	// graceful stop released, claimed by the next recovery pass.
	Released int `json:"released_sessions_claimed"`
	// Other lists the takeovers of a dead owner the run saw no death of
	// before them.
	Other []string `json:"other_takeovers"`
}

// chaosReadTakeovers reads the takeovers in the nodes' logs, and the node
// ID of every incarnation of each node.
func chaosReadTakeovers(nodes []*chaosServer) ([]chaosTakeover, map[string]int) {
	var out []chaosTakeover
	ids := map[string]int{}
	for _, n := range nodes {
		chaosScanLog(n.logPath, 0, func(line string) bool {
			switch {
			case strings.Contains(line, `msg="runtime started"`):
				if id := logAttr(line, "node"); id != "" {
					ids[id] = n.idx
				}
			case strings.Contains(line, `msg="recovery: session taken over"`):
				at, err := time.Parse(time.RFC3339Nano, logAttr(line, "time"))
				if err != nil {
					return true
				}
				out = append(out, chaosTakeover{at: at, taker: logAttr(line, "node"), deadOwner: logAttr(line, "dead_owner"),
					tenant: logAttr(line, "tenant"), session: logAttr(line, "session")})
			}
			return true
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out, ids
}

// chaosTimeTakeovers attributes each takeover to the latest death of its
// dead owner before it, and sums the figures up, in multiples of ttl.
func chaosTimeTakeovers(deaths []Death, takeovers []chaosTakeover, ids map[string]int, nodes int, ttl time.Duration, began time.Time) TakeoverReport {
	rep := TakeoverReport{LeaseTTLS: ttl.Seconds(), Other: []string{}}
	sort.SliceStable(deaths, func(i, j int) bool { return deaths[i].at.Before(deaths[j].at) })
	for _, t := range takeovers {
		if t.deadOwner == "" {
			rep.Released++
			continue
		}
		k := -1
		for i := range deaths {
			if deaths[i].Owner == t.deadOwner && !deaths[i].at.After(t.at) {
				k = i
			}
		}
		if k < 0 {
			rep.Other = append(rep.Other, fmt.Sprintf("%s/%s of %s taken over at %.1f s", t.tenant, t.session, t.deadOwner, t.at.Sub(began).Seconds()))
			continue
		}
		d := &deaths[k]
		if d.sessions == nil {
			d.sessions, d.takers, d.first = map[string]bool{}, map[int]bool{}, t.at
		}
		d.sessions[t.tenant+"/"+t.session] = true
		if i, ok := ids[t.taker]; ok {
			d.takers[i] = true
		}
		d.last = t.at
	}
	perNode := make([][]*Death, nodes)
	perKind := map[string][]*Death{}
	var all []*Death
	for i := range deaths {
		d := &deaths[i]
		if len(d.sessions) == 0 {
			if d.Kind == FaultKill {
				rep.KillsWithout++
			}
			continue
		}
		d.Sessions = len(d.sessions)
		d.FirstS, d.AllS = d.first.Sub(d.at).Seconds(), d.last.Sub(d.at).Seconds()
		d.FirstTTL, d.AllTTL = round2(d.FirstS/ttl.Seconds()), round2(d.AllS/ttl.Seconds())
		d.FirstS, d.AllS = round2(d.FirstS), round2(d.AllS)
		for n := range d.takers {
			d.Takers = append(d.Takers, n)
		}
		sort.Ints(d.Takers)
		if d.Node >= 0 && d.Node < nodes {
			perNode[d.Node] = append(perNode[d.Node], d)
		}
		perKind[d.Kind] = append(perKind[d.Kind], d)
		all = append(all, d)
	}
	rep.Deaths = deaths
	for i := 0; i < nodes; i++ {
		rep.Nodes = append(rep.Nodes, summarizeDeaths(fmt.Sprintf("node %d", i), perNode[i]))
	}
	for _, k := range []struct{ kind, name string }{{FaultKill, "kills"}, {FaultPause, "pauses past the lease"},
		{FaultPgRestart, "lost leases in PostgreSQL restarts"}, {FaultPartition, "partitions from PostgreSQL"}, {chaosLeaseLost, "other lost leases"}, {"exit", "other exits"}} {
		if ds := perKind[k.kind]; len(ds) > 0 {
			rep.Kinds = append(rep.Kinds, summarizeDeaths(k.name, ds))
		}
	}
	rep.All = summarizeDeaths("all", all)
	return rep
}

// summarizeDeaths sums up the deaths whose sessions were taken over.
func summarizeDeaths(name string, ds []*Death) TakeoverSummary {
	s := TakeoverSummary{Name: name}
	var first, all []float64
	for _, d := range ds {
		s.Deaths++
		switch d.Kind {
		case FaultKill:
			s.Kills++
		case FaultPause:
			s.PausesPast++
		default:
			s.LeaseLosses++
		}
		s.Sessions += d.Sessions
		first, all = append(first, d.FirstTTL), append(all, d.AllTTL)
		s.AllMaxSeconds = max(s.AllMaxSeconds, d.AllS)
	}
	s.FirstMedian, s.FirstMax = medianMax(first)
	s.AllMedian, s.AllMax = medianMax(all)
	return s
}

func medianMax(v []float64) (float64, float64) {
	if len(v) == 0 {
		return 0, 0
	}
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	m := v[len(v)/2]
	if len(v)%2 == 0 {
		m = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return round2(m), round2(v[len(v)-1])
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

// logAttr is the value of key in a line of slog's text format
// (key=value, or key="quoted value"); "" when the line has none.
func logAttr(line, key string) string {
	for rest := line; rest != ""; {
		rest = strings.TrimLeft(rest, " ")
		eq := strings.IndexByte(rest, '=')
		if eq < 0 {
			return ""
		}
		k, v := rest[:eq], rest[eq+1:]
		var val string
		if strings.HasPrefix(v, `"`) {
			q, err := strconv.QuotedPrefix(v)
			if err != nil {
				return ""
			}
			val, _ = strconv.Unquote(q)
			rest = v[len(q):]
		} else {
			end := strings.IndexByte(v, ' ')
			if end < 0 {
				end = len(v)
			}
			val, rest = v[:end], v[end:]
		}
		if k == key {
			return val
		}
	}
	return ""
}
