package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/agenthost/agenthost/internal/pgserver"
)

// The partition fault's proxy reaches the same database as the DSN it
// stands in front of (the test server's Unix socket), and cuts it off
// while blackholed: a query then gets no answer (it runs out of time, it
// is not refused), and a new connection works again once it heals.
func TestThePartitionProxyCutsANodeOffFromItsDatabase(t *testing.T) {
	dsn := pgserver.NewDatabase(t)
	p, through, err := PostgresProxy(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	database := func(dsn string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var name string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
		return name
	}
	if direct, proxied := database(dsn), database(through); direct != proxied {
		t.Fatalf("through the proxy the DSN reaches database %q, directly %q", proxied, direct)
	}
	if p.Stats().Accepted == 0 {
		t.Fatal("the DSN through the proxy did not go through it")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, through)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	p.Blackhole()
	qctx, qcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	var one int
	err = conn.QueryRow(qctx, "SELECT 1").Scan(&one)
	qcancel()
	if err == nil || qctx.Err() == nil {
		t.Fatalf("a query across the partition answered (%d, %v); want no answer until its context ran out", one, err)
	}
	p.Heal()
	if got := database(through); got == "" {
		t.Fatal("no database through the healed proxy")
	}
}

// dsnThrough puts the proxy's host and port in a DSN of either form, and
// keeps the rest.
func TestDSNThroughTheProxyKeepsAllButTheHostAndPort(t *testing.T) {
	for _, dsn := range []string{
		"host=/tmp/agpg1/sock port=5432 user=postgres dbname=chaos sslmode=disable",
		"postgres://agent:pw@db.example:5433/chaos?sslmode=disable&application_name=x",
		"postgresql://agent@/chaos?host=/var/run/postgresql&port=5433&sslmode=disable",
	} {
		out, err := dsnThrough(dsn, "127.0.0.1:40123")
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		in, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgconn.ParseConfig(out)
		if err != nil {
			t.Fatalf("%s: the DSN through the proxy, %s, does not parse: %v", dsn, out, err)
		}
		if got.Host != "127.0.0.1" || got.Port != 40123 || got.User != in.User || got.Database != in.Database || got.Password != in.Password {
			t.Errorf("%s through the proxy is %s: host %s port %d user %s database %s", dsn, out, got.Host, got.Port, got.User, got.Database)
		}
	}
}

// A session of the node cut off taken over before the node gave its
// lease up is a violation: both may have run its effects at once.
func TestChaosFindsATakeoverBeforeThePartitionedNodeGaveItsLeaseUp(t *testing.T) {
	began := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return began.Add(time.Duration(s * float64(time.Second))) }
	marks := []chaosPartitionMark{
		{node: 1, owner: "node-a", at: at(10), lostAt: at(21)},
		{node: 2, owner: "node-b", at: at(30), lostAt: at(41)},
	}
	takeovers := []chaosTakeover{
		{at: at(25), taker: "node-c", deadOwner: "node-a", tenant: "alpha", session: "s1"},
		{at: at(20), taker: "node-c", deadOwner: "node-b", tenant: "beta", session: "s2"}, // before node-b gave its lease up
		{at: at(40.5), taker: "node-c", deadOwner: "node-b", tenant: "beta", session: "s3"},
		{at: at(44), taker: "node-c", deadOwner: "node-b", tenant: "beta", session: "s4"},
	}
	v := chaosCheckPartitions(marks, takeovers, began)
	if len(v) != 2 || !strings.Contains(v[0], "beta/s2") || !strings.Contains(v[1], "beta/s3") || !strings.Contains(v[1], "still trusted its lease") {
		t.Fatalf("violations %q: want the two takeovers of node-b's sessions before it gave its lease up at 41 s", v)
	}
	if v := chaosCheckPartitions(marks, takeovers[:1], began); len(v) != 0 {
		t.Fatalf("violations %q for a takeover after the lease was given up", v)
	}
}
