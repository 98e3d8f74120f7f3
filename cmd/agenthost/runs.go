package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/agenthost/agenthost/internal/httpapi"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// defaultServer is the server the runs commands talk to when neither
// --server, AGENTHOST_SERVER nor --config names one.
const defaultServer = "http://127.0.0.1:8080"

// runsClient is the runs commands' HTTP client of an agenthost server.
type runsClient struct {
	g      *globals
	server string
	token  string
	asJSON bool
	http   *http.Client
}

func newRunsCmd(g *globals) *cobra.Command {
	c := &runsClient{g: g, http: &http.Client{}}
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List, show, follow, cancel and answer Runs on an agenthost server",
		Long: `runs talks to an agenthost server (agenthost serve) over its HTTP API, as the
tenant the token belongs to.

The server is --server, else $AGENTHOST_SERVER, else the listen address of
the file --config names, else ` + defaultServer + `. The token is --token, else
$AGENTHOST_TOKEN. An error the server answers is printed as it sent it
(status, code and message), and the command exits 1.`,
		Example: `  export AGENTHOST_TOKEN=demo-token
  agenthost runs list --session s1
  agenthost runs show run_mx1r32mfv5e3u4335v5ig
  agenthost runs events run_mx1r32mfv5e3u4335v5ig --after 4
  agenthost runs approve run_mx1r32mfv5e3u4335v5ig --call call_1_1
  agenthost runs approve run_mx1r32mfv5e3u4335v5ig --call call_1_1 --deny --reason "not today"
  agenthost runs input run_mx1r32mfv5e3u4335v5ig --message "Ada"
  agenthost runs cancel run_mx1r32mfv5e3u4335v5ig --reason "no longer needed"`,
	}
	cmd.PersistentFlags().StringVar(&c.server, "server", "", "the server's base URL (default: $AGENTHOST_SERVER, the config's listen, or "+defaultServer+")")
	cmd.PersistentFlags().StringVar(&c.token, "token", "", "the tenant's API token (default: $AGENTHOST_TOKEN)")
	cmd.PersistentFlags().BoolVar(&c.asJSON, "json", false, "print the server's JSON instead of readable text")
	cmd.AddCommand(c.listCmd(), c.showCmd(), c.eventsCmd(), c.cancelCmd(), c.approveCmd(), c.inputCmd())
	return cmd
}

// base returns the server's base URL, without a trailing slash.
func (c *runsClient) base() (string, error) {
	s := c.server
	if s == "" {
		s = os.Getenv("AGENTHOST_SERVER")
	}
	if s == "" && (c.g.config != "" || os.Getenv("AGENTHOST_CONFIG") != "") {
		cfg, err := c.g.loadConfig()
		if err != nil {
			return "", err
		}
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return "", fmt.Errorf("%s: listen %q: %w; pass --server URL", cfg.File, cfg.Listen, err)
		}
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		s = "http://" + net.JoinHostPort(host, port)
	}
	if s == "" {
		s = defaultServer
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("runs: --server %q is not an http(s) URL: write it like %s", s, defaultServer)
	}
	return strings.TrimRight(s, "/"), nil
}

// apiError is an error the server answered with its JSON error body.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("the server answered %d %s: %s", e.status, e.code, e.message)
}

// call sends a request and decodes a 2xx JSON answer into out; any other
// answer becomes an error that carries the server's own error body.
func (c *runsClient) call(ctx context.Context, method, path string, body any, out any) error {
	return c.callIf(ctx, method, path, body, -1, out)
}

// callIf is call with If-Match set to the Run version ifSeq, unless it is
// negative: the server applies the request only while the Run is at it.
func (c *runsClient) callIf(ctx context.Context, method, path string, body any, ifSeq int64, out any) error {
	var header http.Header
	if ifSeq >= 0 {
		header = http.Header{"If-Match": {`"` + strconv.FormatInt(ifSeq, 10) + `"`}}
	}
	resp, err := c.send(ctx, method, path, body, header)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("runs: reading the answer to %s %s: %w", method, path, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("runs: the answer to %s %s is not the JSON expected: %w", method, path, err)
		}
	}
	return nil
}

// send sends a request and returns a 2xx response; any other status is
// read into an *apiError.
func (c *runsClient) send(ctx context.Context, method, path string, body any, header http.Header) (*http.Response, error) {
	base, err := c.base()
	if err != nil {
		return nil, err
	}
	token := c.token
	if token == "" {
		token = os.Getenv("AGENTHOST_TOKEN")
	}
	if token == "" {
		return nil, errors.New("runs: no token: pass --token TOKEN or set AGENTHOST_TOKEN (a token of your tenant; the config holds its sha256 under tenants.ID.tokens_sha256)")
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return nil, fmt.Errorf("runs: %w", err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("runs: %s %s: %w (is `agenthost serve` running there? pass --server URL)", method, base+path, err)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
		return nil, &apiError{status: resp.StatusCode, code: http.StatusText(resp.StatusCode), message: strings.TrimSpace(string(raw))}
	}
	ae := &apiError{status: resp.StatusCode, code: e.Error.Code, message: e.Error.Message}
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		ae.message += " (Retry-After: " + ra + "s)"
	}
	return nil, ae
}

// printRun prints a Run as JSON (--json) or for a person.
func (c *runsClient) printRun(w io.Writer, raw json.RawMessage) error {
	if c.asJSON {
		return printJSON(w, raw)
	}
	var r httpapi.RunJSON
	if err := json.Unmarshal(raw, &r); err != nil {
		return err
	}
	fmt.Fprintf(w, "run %s (session %s): %s\n", r.ID, r.Session, r.Status)
	fmt.Fprintf(w, "  agent: %s %s\n", r.Agent, r.AgentVersion)
	fmt.Fprintf(w, "  created %s, updated %s, %d steps, %d events (its version, for --if-seq)\n", r.CreatedAt, r.UpdatedAt, r.Step, r.Seq)
	fmt.Fprintf(w, "  usage: %d input tokens, %d output tokens\n", r.Usage.InputTokens, r.Usage.OutputTokens)
	fmt.Fprintf(w, "  input: %s\n", oneLineText(r.Input))
	if r.Result != nil {
		fmt.Fprintf(w, "  answer: %s\n", oneLineText(r.Result.Content))
	}
	if r.Failure != nil {
		fmt.Fprintf(w, "  failure: %s: %s\n", r.Failure.Class, oneLineText(r.Failure.Message))
	}
	if wt := r.Waiting; wt != nil {
		for _, a := range wt.Approvals {
			fmt.Fprintf(w, "  waiting: tool %s %s needs approval: agenthost runs approve %s --call %s [--deny]\n", a.Tool, argsText(a.Arguments), r.ID, a.ToolCallID)
		}
		if wt.Input != nil {
			fmt.Fprintf(w, "  waiting: the model asks: %s (answer: agenthost runs input %s --message TEXT)\n", oneLineText(wt.Input.Prompt), r.ID)
		}
		for _, p := range wt.Pending {
			what := string(p.Kind)
			if p.Tool != "" {
				what = "tool " + p.Tool
			}
			fmt.Fprintf(w, "  in flight: %s (%s)\n", what, p.Effect)
		}
		if wt.WakeAt != "" {
			fmt.Fprintf(w, "  next timer: %s\n", wt.WakeAt)
		}
		if wt.Queued {
			fmt.Fprintf(w, "  queued: an earlier Run of session %s is not finished\n", r.Session)
		}
	}
	return nil
}

func printJSON(w io.Writer, raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

func (c *runsClient) listCmd() *cobra.Command {
	var session, agent string
	var after, limit int64
	cmd := &cobra.Command{
		Use:   "list --session ID | --agent NAME",
		Short: "List the Runs of a session, or of an agent, oldest first",
		Long: `list lists the Runs of a session (--session), or the tenant's Runs of one
agent (--agent, through GET /v1/runs?agent=). With both, it lists the
session's Runs of that agent.`,
		Example: "  agenthost runs list --session s1\n  agenthost runs list --session s1 --after 50 --limit 50 --json\n  agenthost runs list --agent support",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			agent = strings.ToLower(agent)
			switch {
			case session == "" && agent == "":
				return errors.New("runs list: pass --session ID (the session whose Runs to list) or --agent NAME (the agent whose Runs to list)")
			case session == "":
				return c.listAgentRuns(cmd, agent, limit)
			}
			q := url.Values{"after": {strconv.FormatInt(after, 10)}, "limit": {strconv.FormatInt(limit, 10)}}
			var raw json.RawMessage
			if err := c.call(cmd.Context(), "GET", "/v1/sessions/"+url.PathEscape(session)+"/runs?"+q.Encode(), nil, &raw); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if c.asJSON && agent == "" {
				return printJSON(out, raw)
			}
			var page httpapi.RunListJSON
			if err := json.Unmarshal(raw, &page); err != nil {
				return err
			}
			if agent != "" {
				// The session's page, less the Runs of other agents.
				page.Runs = slices.DeleteFunc(page.Runs, func(r httpapi.RunSummaryJSON) bool { return r.Agent != agent })
				if c.asJSON {
					b, err := json.Marshal(page)
					if err != nil {
						return err
					}
					return printJSON(out, b)
				}
			}
			if len(page.Runs) == 0 {
				fmt.Fprintf(out, "session %s has no Runs after %d\n", session, after)
			} else {
				fmt.Fprintf(out, "%-4s %-26s %-10s %-16s %-24s %s\n", "#", "RUN", "STATUS", "AGENT", "CREATED", "INPUT")
				for _, r := range page.Runs {
					fmt.Fprintf(out, "%-4d %-26s %-10s %-16s %-24s %s\n", r.Ordinal, r.ID, r.Status, r.Agent, r.CreatedAt, truncateText(oneLineText(r.InputPreview), 60))
				}
			}
			if page.NextAfter != nil {
				more := "agenthost runs list --session " + session
				if agent != "" {
					more += " --agent " + agent
				}
				fmt.Fprintf(out, "more: %s --after %d\n", more, *page.NextAfter)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&session, "session", "", "the session")
	cmd.Flags().StringVar(&agent, "agent", "", "list only the Runs of this agent")
	cmd.Flags().Int64Var(&after, "after", 0, "list the Runs after this ordinal (with --session)")
	cmd.Flags().Int64Var(&limit, "limit", 50, "at most this many Runs (1 to 500)")
	return cmd
}

// listAgentRuns prints the tenant's Runs of agent, a page at a time
// (GET /v1/runs?agent=), until limit are printed or there are no more.
func (c *runsClient) listAgentRuns(cmd *cobra.Command, agent string, limit int64) error {
	out := cmd.OutOrStdout()
	var all []httpapi.TenantRunJSON
	after := ""
	for int64(len(all)) < limit {
		q := url.Values{"agent": {agent}, "limit": {strconv.FormatInt(limit-int64(len(all)), 10)}}
		if after != "" {
			q.Set("after", after)
		}
		var page httpapi.TenantRunListJSON
		if err := c.call(cmd.Context(), "GET", "/v1/runs?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		all = append(all, page.Runs...)
		if page.NextAfter == "" {
			break
		}
		after = page.NextAfter
	}
	if c.asJSON {
		b, err := json.Marshal(httpapi.TenantRunListJSON{Runs: all})
		if err != nil {
			return err
		}
		return printJSON(out, b)
	}
	if len(all) == 0 {
		fmt.Fprintf(out, "agent %s has no Runs\n", agent)
		return nil
	}
	fmt.Fprintf(out, "%-26s %-12s %-10s %-24s %s\n", "RUN", "SESSION", "STATUS", "CREATED", "INPUT")
	for _, r := range all {
		fmt.Fprintf(out, "%-26s %-12s %-10s %-24s %s\n", r.ID, r.Session, r.Status, r.CreatedAt, truncateText(oneLineText(r.InputPreview), 60))
	}
	return nil
}

func truncateText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func (c *runsClient) showCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "show RUN",
		Short:   "Show a Run: status, usage, answer or failure, and what it waits for",
		Example: "  agenthost runs show run_mx1r32mfv5e3u4335v5ig\n  agenthost runs show run_mx1r32mfv5e3u4335v5ig --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var raw json.RawMessage
			if err := c.call(cmd.Context(), "GET", "/v1/runs/"+url.PathEscape(args[0]), nil, &raw); err != nil {
				return err
			}
			return c.printRun(cmd.OutOrStdout(), raw)
		},
	}
}

func (c *runsClient) cancelCmd() *cobra.Command {
	var reason string
	var ifSeq int64
	cmd := &cobra.Command{
		Use:     "cancel RUN",
		Short:   "Cancel a Run (tools in flight are asked to stop)",
		Example: `  agenthost runs cancel run_mx1r32mfv5e3u4335v5ig --reason "no longer needed"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var body any
			if reason != "" {
				body = map[string]string{"reason": reason}
			}
			var raw json.RawMessage
			if err := c.callIf(cmd.Context(), "POST", "/v1/runs/"+url.PathEscape(args[0])+"/cancel", body, ifSeq, &raw); err != nil {
				return err
			}
			return c.printRun(cmd.OutOrStdout(), raw)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (kept in the Run's log)")
	ifSeqFlag(cmd, &ifSeq)
	return cmd
}

func (c *runsClient) approveCmd() *cobra.Command {
	var ifSeq int64
	var calls []string
	var deny bool
	var reason string
	cmd := &cobra.Command{
		Use:   "approve RUN --call ID [--deny] [--reason TEXT]",
		Short: "Approve (or, with --deny, deny) tool calls a Run waits on",
		Long: `approve answers the tool calls a Run waits on for a person's approval. The
IDs are the tool_call_id values that runs show lists. A denied call is not
carried out; the model is told it was denied, with the reason.`,
		Example: `  agenthost runs approve run_mx1r32mfv5e3u4335v5ig --call call_1_1
  agenthost runs approve run_mx1r32mfv5e3u4335v5ig --call call_1_1 --call call_1_2 --deny --reason "too costly"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(calls) == 0 {
				return fmt.Errorf("runs approve: pass --call ID for each tool call to answer (see: agenthost runs show %s)", args[0])
			}
			decisions := make([]map[string]any, 0, len(calls))
			for _, id := range calls {
				d := map[string]any{"tool_call_id": id, "approved": !deny}
				if reason != "" {
					d["reason"] = reason
				}
				decisions = append(decisions, d)
			}
			var raw json.RawMessage
			if err := c.callIf(cmd.Context(), "POST", "/v1/runs/"+url.PathEscape(args[0])+"/input", map[string]any{"approvals": decisions}, ifSeq, &raw); err != nil {
				return err
			}
			return c.printRun(cmd.OutOrStdout(), raw)
		},
	}
	cmd.Flags().StringArrayVar(&calls, "call", nil, "a tool call ID to answer (repeatable)")
	cmd.Flags().BoolVar(&deny, "deny", false, "deny the calls instead of approving them")
	cmd.Flags().StringVar(&reason, "reason", "", "why (the model sees it for a denial)")
	ifSeqFlag(cmd, &ifSeq)
	return cmd
}

func (c *runsClient) inputCmd() *cobra.Command {
	var message string
	var ifSeq int64
	cmd := &cobra.Command{
		Use:     "input RUN --message TEXT",
		Short:   "Answer the question a Run's model asked the user",
		Example: `  agenthost runs input run_mx1r32mfv5e3u4335v5ig --message "Ada"`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if message == "" {
				return fmt.Errorf("runs input: pass --message TEXT, the answer to the model's question (see: agenthost runs show %s)", args[0])
			}
			var raw json.RawMessage
			if err := c.callIf(cmd.Context(), "POST", "/v1/runs/"+url.PathEscape(args[0])+"/input", map[string]string{"message": message}, ifSeq, &raw); err != nil {
				return err
			}
			return c.printRun(cmd.OutOrStdout(), raw)
		},
	}
	cmd.Flags().StringVar(&message, "message", "", "the answer (required)")
	ifSeqFlag(cmd, &ifSeq)
	return cmd
}

// ifSeqFlag adds --if-seq, which sends If-Match with a Run's version.
func ifSeqFlag(cmd *cobra.Command, ifSeq *int64) {
	cmd.Flags().Int64Var(ifSeq, "if-seq", -1, `apply only while the Run is still at this version (the event count "runs show" prints); if it moved on, nothing is written`)
}

func (c *runsClient) eventsCmd() *cobra.Command {
	var after int64
	cmd := &cobra.Command{
		Use:   "events RUN [--after SEQ]",
		Short: "Follow a Run's events until it ends",
		Long: `events follows the Run's event stream (Server-Sent Events) and prints each
event as it is committed, until the terminal one. --after SEQ resumes after
event SEQ (the numbers are printed with --json, and "runs show" gives the
last). If the stream ends early (the server stopped), it says where to
resume from and exits 1.`,
		Example: "  agenthost runs events run_mx1r32mfv5e3u4335v5ig\n  agenthost runs events run_mx1r32mfv5e3u4335v5ig --after 4 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return c.follow(ctx, cmd.OutOrStdout(), args[0], after)
		},
	}
	cmd.Flags().Int64Var(&after, "after", 0, "resume after this event number (Last-Event-ID)")
	return cmd
}

func (c *runsClient) follow(ctx context.Context, out io.Writer, runID string, after int64) error {
	h := http.Header{"Accept": {"text/event-stream"}}
	if after > 0 {
		h.Set("Last-Event-ID", strconv.FormatInt(after, 10))
	}
	resp, err := c.send(ctx, "GET", "/v1/runs/"+url.PathEscape(runID)+"/events", nil, h)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	p := newPrinter(out)
	last, ended := after, false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var event, id string
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if event != "" {
				payload := strings.Join(data, "\n")
				if c.asJSON {
					fmt.Fprintf(out, "{\"id\":%q,\"event\":%q,\"data\":%s}\n", id, event, payload)
				} else {
					c.printEvent(p, event, payload)
				}
				if id != "" {
					last, _ = strconv.ParseInt(id, 10, 64)
				}
				if event == string(loop.EventRunCompleted) || event == string(loop.EventRunFailed) || event == string(loop.EventRunCancelled) {
					ended = true
				}
			}
			event, id, data = "", "", nil
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "id: "):
			id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			data = append(data, strings.TrimPrefix(line, "data: "))
		}
	}
	if ended {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("runs events: interrupted after event %d; resume with: agenthost runs events %s --after %d", last, runID, last)
	}
	return fmt.Errorf("runs events: the stream ended after event %d before the Run did (the server stopped?); resume with: agenthost runs events %s --after %d", last, runID, last)
}

func (c *runsClient) printEvent(p *printer, event, payload string) {
	if event == abi.EmitModelDelta {
		var d httpapi.ModelDeltaJSON
		if json.Unmarshal([]byte(payload), &d) == nil {
			p.item(runtime.StreamItem{Emit: &abi.EmitEvent{Type: abi.EmitModelDelta, Delta: &abi.ModelDelta{Text: d.Text, ToolCalls: d.ToolCalls}},
				EffectID: d.Effect, Plugin: d.Plugin, Attempt: d.Attempt, DeltaSeq: d.Seq})
		}
		return
	}
	if event == "progress" {
		var pj httpapi.ProgressJSON
		if json.Unmarshal([]byte(payload), &pj) == nil {
			p.item(runtime.StreamItem{Emit: &abi.EmitEvent{Type: pj.Type, Message: pj.Message, Data: pj.Data}, EffectID: pj.Effect, Plugin: pj.Plugin})
		}
		return
	}
	var ev loop.Event
	if err := json.Unmarshal([]byte(payload), &ev); err != nil {
		p.printf("  (event %s that cannot be read: %v)", event, err)
		return
	}
	p.item(runtime.StreamItem{Event: &ev})
}
