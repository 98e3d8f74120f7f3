package chaos

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agenthost/agenthost/internal/netfault"
	"github.com/agenthost/agenthost/pgstore"
)

// The partition fault cuts one node off from PostgreSQL while it runs:
// each node reaches the database through a loopback TCP proxy of its own
// (internal/netfault), which the fault blackholes (every byte held, in
// both directions, nothing refused or closed) for --partition, past the
// node's lease, and then heals. The node's renewals hang; it must give
// its lease up on its own clock before the lease can run out at the
// store (docs/DESIGN.md §5.3), whatever they are doing, and exit 1 for
// its supervisor to start it again, while another node takes its
// sessions over. No session of it may be taken over before it gave its
// lease up (its "node lease lost" line is older than every "recovery:
// session taken over" naming it), no job may run twice, and every Run
// must end, whatever its requests held by the partition do once it heals.

// PostgresProxy starts a netfault proxy in front of the PostgreSQL server
// dsn names (a Unix socket, or a TCP address) and returns it with a DSN
// that reaches the same database through it: dsn with its host and port
// replaced by the proxy's. A DSN that sets sslmode=verify-full cannot go
// through it (the certificate names the server, not 127.0.0.1).
func PostgresProxy(dsn string) (*netfault.Proxy, string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, "", fmt.Errorf("the DSN %s does not parse: %w", pgstore.RedactDSN(dsn), err)
	}
	network, addr := "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	if strings.HasPrefix(cfg.Host, "/") {
		network, addr = "unix", filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port)))
	}
	p, err := netfault.Listen(network, addr)
	if err != nil {
		return nil, "", err
	}
	through, err := dsnThrough(dsn, p.Addr())
	if err != nil {
		_ = p.Close()
		return nil, "", err
	}
	return p, through, nil
}

// dsnThrough is dsn with its host and port replaced by addr's (host:port),
// in the DSN's own form: a URL's host, or key=value pairs with host and
// port added at the end, where they override any earlier ones. It checks
// the result names addr.
func dsnThrough(dsn, addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	var out string
	if _, _, isURL := cutURLPrefix(dsn); isURL {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("the DSN %s does not parse as a URL: %w", pgstore.RedactDSN(dsn), err)
		}
		u.Host = addr
		q := u.Query()
		q.Del("host")
		q.Del("hostaddr")
		q.Del("port")
		u.RawQuery = q.Encode()
		out = u.String()
	} else {
		out = strings.TrimSpace(dsn) + " host=" + host + " port=" + port
	}
	cfg, err := pgconn.ParseConfig(out)
	if err != nil {
		return "", fmt.Errorf("the DSN through the proxy does not parse: %w", err)
	}
	if cfg.Host != host || strconv.Itoa(int(cfg.Port)) != port {
		return "", fmt.Errorf("the DSN %s names %s:%d after its host and port were replaced by the proxy's %s: pass one without hostaddr or a second host",
			pgstore.RedactDSN(dsn), cfg.Host, cfg.Port, addr)
	}
	return out, nil
}

// cutURLPrefix tells whether dsn is a URL (postgres:// or postgresql://).
func cutURLPrefix(dsn string) (rest, prefix string, ok bool) {
	for _, p := range []string{"postgresql://", "postgres://"} {
		if r, ok := strings.CutPrefix(dsn, p); ok {
			return r, p, true
		}
	}
	return dsn, "", false
}

// chaosLeaseGivenUpLine is what the runtime logs when it gives its node
// lease up (runtime.loseLease), before serve logs chaosLeaseLostLine.
const chaosLeaseGivenUpLine = `msg="node lease lost`

// chaosLeaseGivenUpAt is when the incarnation whose log begins at from
// gave its lease up, from its log (zero when it has not).
func chaosLeaseGivenUpAt(path string, from int64) time.Time {
	var at time.Time
	chaosScanLog(path, from, func(line string) bool {
		if !strings.Contains(line, chaosLeaseGivenUpLine) {
			return true
		}
		at, _ = time.Parse(time.RFC3339Nano, logAttr(line, "time"))
		return false
	})
	return at
}

// chaosPartitionMark is one partition of a node: the incarnation cut off,
// when the partition began, and when the node gave its lease up.
type chaosPartitionMark struct {
	node   int
	owner  string
	at     time.Time
	lostAt time.Time
}

// partition is the partition fault: node n is cut off from PostgreSQL
// for a --partition drawn, past its lease, then the partition heals. The
// node must have given its lease up by then, and must exit 1 for it
// within --term-bound of the heal; it is started again.
func (r *chaosRun) partition(n *chaosServer, d time.Duration) error {
	o := r.o
	proxy := r.proxies[n.idx]
	owner, logAt := n.incarnation()
	at := time.Now()
	proxy.Blackhole()
	errorsBefore := r.clients.errors.get()
	time.Sleep(d) // the fault's input: how long the partition lasts
	lostAt := chaosLeaseGivenUpAt(n.logPath, logAt)
	proxy.Heal()
	healed := time.Now()
	r.res.Partitions++
	cutOff := r.clients.errors.get() - errorsBefore
	r.partitions = append(r.partitions, chaosPartitionMark{node: n.idx, owner: owner, at: at, lostAt: lostAt})
	r.died(n, FaultPartition, owner, at, 0)
	violation := func(format string, args ...any) {
		v := fmt.Sprintf("partition %d (node %d, %s): ", r.res.Partitions, n.idx, d.Round(time.Millisecond)) + fmt.Sprintf(format, args...)
		r.violations = append(r.violations, v)
		r.progressf("chaos: %s VIOLATION: %s", r.since(at), v)
	}
	if lostAt.IsZero() {
		violation("cut off from PostgreSQL past its %s lease, it never gave the lease up (no %q in its log)", r.ttl, chaosLeaseGivenUpLine)
	} else {
		r.res.MaxLeaseGivenUpMS = max(r.res.MaxLeaseGivenUpMS, msf(lostAt.Sub(at)))
	}
	p := n.current()
	_, exitErr := p.WaitExit(o.TermBound)
	exited := time.Now()
	if exitErr != nil {
		violation("it still ran %s after the partition healed: a node that gave its lease up must exit 1", o.TermBound)
		p.Kill()
	} else if lost, why := n.exitedForLostLease(p); !lost {
		violation("%s", why)
	} else {
		r.res.LeaseLostExits++
		r.res.MaxPartitionExitMS = max(r.res.MaxPartitionExitMS, msf(exited.Sub(at)))
	}
	ready, err := n.start()
	if err != nil {
		r.keep = true
		return fmt.Errorf("bench chaos: seed %d: node %d did not come back after partition %d: %w (work dir kept: %s)", o.Seed, n.idx, r.res.Partitions, err, r.dir)
	}
	r.res.MaxReadyMS = max(r.res.MaxReadyMS, msf(ready))
	gaveUp := "never"
	if !lostAt.IsZero() {
		gaveUp = lostAt.Sub(at).Round(time.Millisecond).String() + " in"
	}
	r.progressf("chaos: %s partition %d: node %d cut off from PostgreSQL for %s (%d requests cut off; lease %s), gave its lease up %s, exited %s after the partition began (%s after it healed), started again, ready in %s",
		r.since(at), r.res.Partitions, n.idx, d.Round(time.Millisecond), cutOff, r.ttl, gaveUp, exited.Sub(at).Round(time.Millisecond),
		exited.Sub(healed).Round(time.Millisecond), ready.Round(time.Millisecond))
	return nil
}

// chaosCheckPartitions holds every partition to its invariant: no session
// of the node cut off was taken over before it gave its lease up.
func chaosCheckPartitions(marks []chaosPartitionMark, takeovers []chaosTakeover, began time.Time) []string {
	var out []string
	for i, m := range marks {
		if m.owner == "" || m.lostAt.IsZero() {
			continue // a violation already
		}
		for _, t := range takeovers {
			if t.deadOwner == m.owner && t.at.Before(m.lostAt) {
				out = append(out, fmt.Sprintf("partition %d (node %d): session %s/%s was taken over at %.3f s, while the node cut off still trusted its lease (it gave it up at %.3f s): both may have run its effects",
					i+1, m.node, t.tenant, t.session, t.at.Sub(began).Seconds(), m.lostAt.Sub(began).Seconds()))
			}
		}
	}
	return out
}
