package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/benchkit"
	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/internal/node"
	"github.com/agenthost/agenthost/internal/serveproc"
	"github.com/agenthost/agenthost/loop"
)

func newBenchHTTPCmd(bf *benchFlags) *cobra.Command {
	p := &runsParams{}
	var conc *string
	cmd := &cobra.Command{
		Use:   "http",
		Short: "The runs load driven through the HTTP API on 127.0.0.1",
		Long: `http serves the API on 127.0.0.1 (as ` + "`agenthost serve`" + ` does, in this process) and drives
the load of ` + "`bench runs`" + ` through it from a bounded client: each of --concurrency
clients submits a Run (POST /v1/sessions/{id}/runs), follows its events
(GET /v1/runs/{id}/events) until it ends, and reads it (GET /v1/runs/{id}).
A Run's latency is from the submission to the final read. Rounds of Runs
are interleaved with rounds of bare Badger commits, as in ` + "`bench runs`" + `.`,
		Example: `  bin/agenthost bench http
  bin/agenthost bench http --runs 2000 --concurrency 8,64 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := p.check(*conc); err != nil {
				return err
			}
			return benchHTTP(cmd, bf, p)
		},
	}
	conc = p.flags(cmd, 1000, "1,16,64")
	return cmd
}

func benchHTTP(cmd *cobra.Command, bf *benchFlags, p *runsParams) error {
	ctx := benchContext(cmd)
	started := time.Now()
	dir, cfg, cleanup, err := runsSetup(bf, "http", p)
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Listen = "127.0.0.1:0"
	bf.progressf(cmd, "starting the server (a cold plugin compile takes seconds; --cache-dir keeps it)")
	srv, err := node.StartServer(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return err
	}
	defer srv.Shutdown(context.WithoutCancel(ctx))
	bare, err := benchkit.OpenBareBadger(filepath.Join(dir, "bare"))
	if err != nil {
		return err
	}
	defer bare.Close()

	maxConc := 1
	for _, c := range p.Concurrency {
		maxConc = max(maxConc, c)
	}
	client := serveproc.NewClient(srv.Addr(), benchToken, 2*time.Minute)
	client.HTTP.Transport.(*http.Transport).MaxIdleConnsPerHost = 2 * maxConc
	ready := time.Now().Add(time.Minute)
	for !srv.Runtime().Ready() {
		if time.Now().After(ready) {
			return fmt.Errorf("bench: the server was not ready within a minute")
		}
		time.Sleep(10 * time.Millisecond) // a readiness poll's cadence
	}
	var session atomic.Int64
	one := func() (time.Duration, error) {
		t0 := time.Now()
		run, err := httpRun(client, fmt.Sprintf("s%d", session.Add(1)), p.Question)
		d := time.Since(t0)
		if err != nil {
			return d, err
		}
		if run.Status != loop.StatusCompleted || run.Result == nil || run.Result.Content != benchAnswer {
			return d, fmt.Errorf("bench: the Run %s ended %s with %+v; want completed with %q", run.ID, run.Status, run.Result, benchAnswer)
		}
		return d, nil
	}
	if _, err := one(); err != nil { // the plugins answer as expected; pools warm
		return err
	}
	var levels []runsLevel
	for _, c := range p.Concurrency {
		bf.progressf(cmd, "concurrency %d: %d Runs over HTTP in %d rounds, each followed by a round of bare Badger commits", c, p.Runs, p.Rounds)
		lvl, err := runsLevelOf(cmd, bf, p, c, srv.Runtime(), srv.Metrics(), bare, one)
		if err != nil {
			return err
		}
		levels = append(levels, lvl)
	}
	return bf.emit(cmd.OutOrStdout(), benchOutput{Bench: "http", Started: started, Machine: bf.thisMachine(), Params: p, Result: levels},
		runsTable("Runs through the HTTP API on 127.0.0.1 (submit, follow the events to the end, read the Run)", levels),
		spentTable(levels))
}

// httpRun submits a Run, follows its event stream until the server ends
// it (the Run ended), and reads the Run.
func httpRun(c *serveproc.Client, session, input string) (httpapi.RunJSON, error) {
	var run httpapi.RunJSON
	code, raw, err := c.Do("POST", "/v1/sessions/"+session+"/runs", map[string]string{"input": input}, nil, &run)
	if err != nil || code != http.StatusCreated {
		return run, fmt.Errorf("bench: submitting to session %s: %d %v %s", session, code, err, raw)
	}
	req, err := http.NewRequest("GET", c.Base+"/v1/runs/"+run.ID+"/events", nil)
	if err != nil {
		return run, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return run, fmt.Errorf("bench: following Run %s: %w", run.ID, err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return run, fmt.Errorf("bench: following Run %s: %d %v", run.ID, resp.StatusCode, err)
	}
	code, raw, err = c.Do("GET", "/v1/runs/"+run.ID, nil, nil, &run)
	if err != nil || code != http.StatusOK {
		return run, fmt.Errorf("bench: reading Run %s: %d %v %s", run.ID, code, err, raw)
	}
	return run, nil
}
