package pgstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/runtime"
)

func TestRedactDSN(t *testing.T) {
	for _, c := range []struct{ dsn, want string }{
		{"postgres://u:sekrit@db:5432/agenthost?sslmode=require", "postgres://u:xxxxx@db:5432/agenthost?sslmode=require"},
		{"postgresql://u:se%40krit@db/x", "postgresql://u:xxxxx@db/x"},
		{"postgres://u:sek/rit@db/x", "postgres://u:xxxxx@db/x"},
		{"postgres://u@db/x?password=sekrit&sslmode=disable", "postgres://u@db/x?password=xxxxx&sslmode=disable"},
		{"postgres://db/x?sslpassword=sekrit", "postgres://db/x?sslpassword=xxxxx"},
		{"postgres://u@db/x", "postgres://u@db/x"},
		{"host=db user=u password=sekrit dbname=x", "host=db user=u password=xxxxx dbname=x"},
		{"host=db password = sekrit dbname=x", "host=db password=xxxxx dbname=x"},
		{"host=db password='sek rit' dbname=x", "host=db password=xxxxx dbname=x"},
		{`host=db password='it\'s sekrit' dbname=x`, "host=db password=xxxxx dbname=x"},
		{"host=db sslpassword=sekrit", "host=db sslpassword=xxxxx"},
		{"host=db password='sekrit", "host=db password=xxxxx"},
		{"garbage u:sekrit@host", "garbage u:xxxxx@host"},
	} {
		if got := RedactDSN(c.dsn); got != c.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", c.dsn, got, c.want)
		}
	}
}

// An error of a connection is shown on one line, without the DSN's
// password in either of the forms PostgreSQL takes.
func TestRedactErrorMasksTheDSNsPassword(t *testing.T) {
	err := errors.New("failed to connect to `user=ann`:\n\tserver said: password \"s3cret!\" refused")
	for _, dsn := range []string{"postgres://ann:s3cret!@db:5432/x", "host=db user=ann password='s3cret!'"} {
		got := RedactError(err, dsn)
		want := "failed to connect to `user=ann`: server said: password \"xxxxx\" refused"
		if got != want {
			t.Errorf("RedactError with %q = %q, want %q", dsn, got, want)
		}
	}
	if got := RedactError(err, "host=db"); !strings.Contains(got, "s3cret!") || strings.Contains(got, "\n") {
		t.Errorf("without a password in the DSN: %q, want the message on one line as it is", got)
	}
}

// checkMessage checks an Open error: one line, with the given start and
// end, and never the password.
func checkMessage(t *testing.T, err error, start, end string) {
	t.Helper()
	if err == nil {
		t.Fatal("Open succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, "sekrit") || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, start) || !strings.HasSuffix(msg, end) {
		t.Fatalf("Open error:\n%s\nwant one line, without the password, starting %q and ending %q", msg, start, end)
	}
	t.Log(msg)
}

func TestOpenRefusesABadDSNWithoutShowingThePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:sekrit@db:notaport/x",
		"postgres://u:sekrit@db/x?connect_timeout=soon",
		"host=db user=u password=sekrit port=notaport",
		"host=db password='sekrit",
		"host=db user=u password=sekrit sslmode=sometimes",
		"password=sekrit and nonsense",
	} {
		_, err := Open(context.Background(), Options{DSN: dsn, Logger: quietLogger()})
		checkMessage(t, err, "pgstore: store.dsn is not a valid PostgreSQL connection string: ", "; see docs/OPERATIONS.md")
	}
	_, err := Open(context.Background(), Options{DSN: "  "})
	checkMessage(t, err, "pgstore: store.dsn is empty", "; see docs/OPERATIONS.md")
	_, err = Open(context.Background(), Options{DSN: "host=db", Schema: "Bad-Name"})
	checkMessage(t, err, `pgstore: schema "Bad-Name" is not a valid schema name`, "at most 63 characters")
}

func TestOpenOfAnUnreachableServerSaysSoWithoutThePassword(t *testing.T) {
	for _, dsn := range []string{
		"host=" + t.TempDir() + " user=postgres password=sekrit dbname=x sslmode=disable",
		"postgres://u:sekrit@127.0.0.1:1/x?sslmode=disable&connect_timeout=5",
	} {
		_, err := Open(context.Background(), Options{DSN: dsn, Logger: quietLogger()})
		checkMessage(t, err, "pgstore: cannot reach PostgreSQL at "+RedactDSN(dsn)+": ", "; check store.dsn and that the server is running")
	}
	// A server that answers but has no such database.
	srv := pgserver.Require(t)
	dsn := srv.DSN("no_such_database") + " password=sekrit"
	_, err := Open(context.Background(), Options{DSN: dsn, Logger: quietLogger()})
	checkMessage(t, err, "pgstore: PostgreSQL at "+RedactDSN(dsn)+" has no such database: ", "or name another one in store.dsn")
}

// TestAServerGoneIsStoreUnavailable stops the server under an open Store:
// every call fails with runtime.ErrStoreUnavailable (KVGet too, never a
// nil value), and the Store still closes.
func TestAServerGoneIsStoreUnavailable(t *testing.T) {
	conformance.SkipInShort(t, "starting a PostgreSQL server")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	s, err := Open(ctx, Options{DSN: srv.DSN("postgres"), Logger: quietLogger(), ConnectTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := newRun(t, s, "t", "s", "r", 1)
	if err := s.KVSet(ctx, "t", "p", []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err = s.LoadRun(ctx, "t", "r")
	wantErr(t, err, runtime.ErrStoreUnavailable, "LoadRun with the server gone")
	_, err = s.Commit(ctx, step(t, r, 0, "", loop.Event{Type: loop.EventRunStarted}))
	wantErr(t, err, runtime.ErrStoreUnavailable, "Commit with the server gone")
	v, err := s.KVGet(ctx, "t", "p", []byte("k"))
	wantErr(t, err, runtime.ErrStoreUnavailable, "KVGet with the server gone")
	if v != nil {
		t.Fatal("KVGet returned a value with an error")
	}
	err = s.RenewNode(ctx, "n", time.Now().Add(time.Minute).UnixMilli())
	if !errors.Is(err, runtime.ErrStoreUnavailable) || errors.Is(err, runtime.ErrNodeExpired) {
		t.Fatalf("RenewNode with the server gone: %v; want ErrStoreUnavailable, not ErrNodeExpired", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
