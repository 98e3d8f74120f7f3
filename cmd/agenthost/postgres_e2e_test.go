package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/agenthost/agenthost/conformance"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/pgserver"
	"github.com/agenthost/agenthost/pgstore"
)

// pgSecret is the password the tests put in their DSNs: the shared test
// server trusts every local login, so it is never asked for, and it must
// show nowhere.
const pgSecret = "s3cret-pw"

// pgConfig writes a config over the conformance plugins whose store is
// PostgreSQL at dsn.
func pgConfig(t *testing.T, dir, dsn string) string {
	t.Helper()
	return writeConfig(t, dir, `
store:
  driver: postgres
  dsn: "`+dsn+`"
  postgres: {max_conns: 4, statement_timeout: 10s}
cache_dir: `+conformance.WazeroCacheDir()+`
log: {level: info}
plugins:
  builder: {path: `+conformancePlugin(t, conformance.PluginBuilder)+`, role: builder}
  executor: {path: `+conformancePlugin(t, conformance.PluginExecutor)+`, role: executor}
tenants:
  demo:
    tokens_sha256: [`+httpapi.HashToken("demo-token")+`]
    builder: builder
    model: executor
    tool_executors: [executor]
`)
}

// TestRunAndServeOnPostgres runs the real binary on a PostgreSQL store:
// `run` completes a Run, then `serve` serves it and takes another, and
// stops cleanly on SIGTERM. The DSN's password shows in no output.
func TestRunAndServeOnPostgres(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	cfg := pgConfig(t, dir, pgserver.NewDatabase(t)+" password="+pgSecret)

	r := runCLI(t, bin, nil, "run", "--config", cfg, "--session", "s1", "please add 2 3")
	if r.code != 0 {
		t.Fatalf("run: exit %d, want 0", r.code)
	}
	mustContain(t, "stdout", r.stdout, "tool add returned: 5", "run completed")
	if strings.Contains(r.stdout+r.stderr, pgSecret) {
		t.Error("run shows the DSN's password")
	}
	r = runCLI(t, bin, nil, "run", "--config", cfg, "--data-dir", dir, "q")
	if r.code != 1 || !strings.Contains(r.stderr, "--data-dir "+dir+" names a Badger directory, but the store is postgres ") {
		t.Errorf("--data-dir with postgres: exit %d, %s", r.code, r.stderr)
	}

	cmd := exec.Command(bin, "serve", "--config", cfg, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var first string
	select {
	case first = <-lines:
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve printed nothing in 2 minutes; stderr:\n%s", stderr.String())
	}
	addr, rest, ok := strings.Cut(strings.TrimPrefix(first, "agenthost serving on http://"), " ")
	if !ok || !strings.HasPrefix(rest, "(postgres host=") || !strings.Contains(rest, "password=xxxxx") {
		t.Errorf("serve's first line %q does not name the store with its password hidden", first)
	}
	c := newClient(addr, "demo-token")
	waitUntil(t, time.Minute, "readyz", func() (bool, error) {
		code, raw, err := c.Do("GET", "/readyz", nil, nil, nil)
		return code == http.StatusOK, fmt.Errorf("%d %v %s", code, err, raw)
	})
	var old struct{ Runs []runView }
	if code, raw, err := c.Do("GET", "/v1/sessions/s1/runs", nil, nil, &old); code != http.StatusOK || len(old.Runs) != 1 || old.Runs[0].Status != "completed" {
		t.Fatalf("the Run `run` made: %d %v %s", code, err, raw)
	}
	var created runView
	if code, raw, err := c.Do("POST", "/v1/sessions/s2/runs", map[string]any{"input": "please add 4 5"}, nil, &created); code != http.StatusCreated {
		t.Fatalf("submit: %d %v %s", code, err, raw)
	}
	waitUntil(t, time.Minute, "the Run served to complete", func() (bool, error) {
		var v runView
		code, raw, err := c.Do("GET", "/v1/runs/"+created.ID, nil, nil, &v)
		return code == http.StatusOK && v.Status == "completed", fmt.Errorf("%d %v %s", code, err, raw)
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve after SIGTERM: %v, want exit 0; stderr:\n%s", err, stderr.String())
	}
	if strings.Contains(stderr.String(), pgSecret) {
		t.Errorf("serve's log shows the DSN's password:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "store=\"postgres host=") {
		t.Errorf("serve's log does not name the store:\n%s", stderr.String())
	}
}

// TestPostgresStoreRefusalsAreOneLine: a DSN that does not parse, a
// server that cannot be reached and a schema newer than the binary each
// stop `run` and `serve` with exit status 1 and one line on stderr that
// names the config key and hides the password.
func TestPostgresStoreRefusalsAreOneLine(t *testing.T) {
	bin := buildBinary(t)
	tooNew := pgserver.NewDatabase(t)
	ctx := context.Background()
	st, err := pgstore.Open(ctx, pgstore.Options{DSN: tooNew, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Close()
	conn, err := pgx.Connect(ctx, tooNew)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s.agenthost_schema (version) VALUES (%d)", pgstore.DefaultSchema, pgstore.SchemaVersion()+1)); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)

	for _, tc := range []struct {
		name, dsn string
		want      string
	}{
		{"a DSN that does not parse", "postgres://agenthost:" + pgSecret + "@db.internal:notaport/agenthost", "not a valid"},
		{"a server that cannot be reached", "host=" + filepath.Join(t.TempDir(), "nosock") + " user=agenthost password=" + pgSecret + " dbname=agenthost connect_timeout=5", "host="},
		{"a schema newer than this binary", tooNew + " password=" + pgSecret, "newer"},
	} {
		for _, command := range []string{"run", "serve"} {
			t.Run(tc.name+" ("+command+")", func(t *testing.T) {
				cfg := pgConfig(t, t.TempDir(), tc.dsn)
				args := []string{command, "--config", cfg}
				if command == "run" {
					args = append(args, "q")
				} else {
					args = append(args, "--listen", "127.0.0.1:0")
				}
				r := runCLI(t, bin, nil, args...)
				if r.code != 1 {
					t.Fatalf("exit %d, want 1", r.code)
				}
				msg := strings.TrimSuffix(r.stderr, "\n")
				if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "agenthost: "+cfg+": store (postgres ") {
					t.Errorf("stderr is not one line naming the config's store:\n%s", r.stderr)
				}
				if !strings.Contains(msg, tc.want) {
					t.Errorf("stderr does not say %q:\n%s", tc.want, r.stderr)
				}
				if strings.Contains(r.stdout+r.stderr, pgSecret) {
					t.Errorf("the output shows the DSN's password:\n%s", r.stderr)
				}
			})
		}
	}
}
