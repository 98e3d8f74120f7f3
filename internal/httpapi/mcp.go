package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/url"

	"github.com/agenthost/agenthost/internal/mcpserver"
	"github.com/agenthost/agenthost/loop"
	"github.com/agenthost/agenthost/plugins/abi"
	"github.com/agenthost/agenthost/runtime"
)

// The MCP endpoint, /mcp (package mcpserver): the tenant's agents as MCP
// tools, over MCP's streamable HTTP transport. It is authenticated, rate
// limited and drained as the /v1 routes are (authed); its tool calls are
// submissions (the submission rate, the field limits and the quotas
// apply), and the calls that wait for a Run count as event streams.

// CodeTooManySessions answers a request that would open an MCP session
// while the tenant has its bound of sessions open on this server (429).
const CodeTooManySessions = "too_many_mcp_sessions"

// LimitMCPSessions is how OnLimit names a session refused for the
// tenant's bound.
const LimitMCPSessions = "max_mcp_sessions_per_tenant"

// newMCP makes the MCP endpoint's handler over the server.
func (s *Server) newMCP() (*mcpserver.Handler, error) {
	return mcpserver.New(mcpserver.Config{Backend: mcpBackend{s}, Drain: s.drain,
		WriteTimeout: s.cfg.StreamWriteTimeout, Logger: s.log})
}

// serveMCP serves POST, GET and DELETE /mcp.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request, tenant string) error {
	if r.Method == http.MethodPost && r.Header.Get(mcpserver.SessionHeader) == "" && s.mcp.SessionsFull(tenant) {
		s.cfg.OnLimit(LimitMCPSessions, tenant)
		e := errorf(http.StatusTooManyRequests, CodeTooManySessions,
			"this tenant has %d MCP sessions open on this server, its bound; end one (DELETE /mcp with its Mcp-Session-Id), or retry after the Retry-After delay: an idle session closes after %s",
			s.mcp.MaxSessionsPerTenant(), mcpserver.DefaultSessionTimeout)
		e.RetryAfter = s.cfg.RetryAfter
		return e
	}
	if err := s.mcp.ServeTenant(w, r, tenant); err != nil {
		return readError(err)
	}
	return nil
}

// mcpBackend is the server as the MCP endpoint uses it.
type mcpBackend struct{ s *Server }

func (b mcpBackend) Agents(tenant string) []mcpserver.Agent {
	shown := b.s.cfg.Agents[tenant]
	out := make([]mcpserver.Agent, 0, len(shown))
	for _, a := range shown {
		out = append(out, mcpserver.Agent{Name: a.Name, Description: a.Description, Instructions: a.Instructions, OutputSchema: a.OutputSchema})
	}
	return out
}

func (b mcpBackend) Submit(ctx context.Context, tenant string, sub mcpserver.Submission) (loop.Run, error) {
	if e := b.s.takeSubmission(tenant); e != nil {
		return loop.Run{}, refusal(e)
	}
	req := SubmitRequest{Input: sub.Input, Agent: sub.Agent}
	run, _, err := b.s.submit(ctx, tenant, sub.Session, "", req)
	if errors.Is(err, runtime.ErrUnknownAgent) {
		return loop.Run{}, refusal(b.s.agentNotFound(tenant, sub.Agent))
	}
	if err != nil {
		return loop.Run{}, b.refusal(ctx, "", err)
	}
	return run, nil
}

func (b mcpBackend) LoadRun(ctx context.Context, tenant, runID string) (loop.Run, error) {
	run, err := b.s.cfg.Runtime.LoadRun(ctx, tenant, runID)
	if err != nil && !errors.Is(err, runtime.ErrRunNotFound) {
		return loop.Run{}, b.refusal(ctx, runID, err)
	}
	return run, err
}

func (b mcpBackend) Runs(ctx context.Context, tenant, after string, limit int) ([]loop.Run, string, error) {
	ids, more, err := b.s.tenantRunIDs(ctx, tenant, allStatuses, true, after, limit)
	if err != nil {
		return nil, "", b.refusal(ctx, "", err)
	}
	runs := make([]loop.Run, 0, len(ids))
	for _, id := range ids {
		run, err := b.s.cfg.Store.LoadRun(ctx, tenant, id)
		if errors.Is(err, runtime.ErrRunNotFound) {
			continue // gone between the index read and this one
		}
		if err != nil {
			return nil, "", b.refusal(ctx, id, err)
		}
		runs = append(runs, run)
	}
	next := ""
	if more && len(ids) > 0 {
		next = ids[len(ids)-1]
	}
	return runs, next, nil
}

func (b mcpBackend) Cancel(ctx context.Context, tenant, runID, reason string) (loop.Run, error) {
	run, err := b.s.cfg.Runtime.Cancel(ctx, tenant, runID, reason)
	if errors.Is(err, loop.ErrNoChange) { // already being cancelled or ending
		run, err = b.s.cfg.Runtime.LoadRun(ctx, tenant, runID)
	}
	if err != nil {
		return loop.Run{}, b.refusal(ctx, runID, err)
	}
	return run, nil
}

func (b mcpBackend) Approve(ctx context.Context, tenant, runID string, decisions []abi.ApprovalDecision) (loop.Run, error) {
	req := InputRequest{}
	for _, d := range decisions {
		req.Approvals = append(req.Approvals, ApprovalRequest{ToolCallID: d.ToolCallID, Approved: &d.Approved, Reason: d.Reason})
	}
	return b.answer(ctx, tenant, runID, req, func() (loop.Run, error) {
		return b.s.cfg.Runtime.Approve(ctx, tenant, runID, decisions)
	})
}

func (b mcpBackend) ProvideInput(ctx context.Context, tenant, runID, text string) (loop.Run, error) {
	return b.answer(ctx, tenant, runID, InputRequest{Message: &text}, func() (loop.Run, error) {
		return b.s.cfg.Runtime.ProvideInput(ctx, tenant, runID, text)
	})
}

// answer gives a Run an answer as POST /v1/runs/{id}/input does: within
// the field limits and the storage quota.
func (b mcpBackend) answer(ctx context.Context, tenant, runID string, req InputRequest, give func() (loop.Run, error)) (loop.Run, error) {
	if err := b.s.checkInputFields(tenant, req); err != nil {
		return loop.Run{}, b.refusal(ctx, runID, err)
	}
	res, err := b.s.reserveInput(ctx, tenant, req)
	if err != nil {
		return loop.Run{}, b.refusal(ctx, runID, err)
	}
	run, err := give()
	settleReservation(res, err, false)
	if err != nil {
		return loop.Run{}, b.refusal(ctx, runID, err)
	}
	return run, nil
}

func (b mcpBackend) Follow(tenant, runID string, fromSeq int64) (*runtime.Follower, error) {
	limit := b.s.maxStreamsPerTenant()
	f, err := b.s.cfg.Runtime.NewFollower(tenant, runID, fromSeq, runtime.FollowOptions{MaxPerTenant: limit})
	if errors.Is(err, runtime.ErrTooManyFollowers) {
		b.s.cfg.OnLimit(LimitStreams, tenant)
		e := errorf(http.StatusTooManyRequests, CodeTooManyStreams,
			"too many event streams: this tenant has %d event streams and MCP calls waiting for a Run open on this server, its limit (http.max_streams_per_tenant)", limit)
		e.RetryAfter = b.s.cfg.RetryAfter
		return nil, refusal(e)
	}
	return f, err
}

// refusal is an API error as the MCP endpoint's.
func refusal(e *apiError) *mcpserver.Error {
	return &mcpserver.Error{Status: e.Status, Code: e.Code, Message: e.Message, RetryAfter: e.RetryAfter}
}

// refusal maps an error of the runtime or the store about one of the
// tenant's Runs (none when runID is "") as the API does, logging what it
// does not show.
func (b mcpBackend) refusal(ctx context.Context, runID string, err error) *mcpserver.Error {
	var ae *apiError
	if !errors.As(err, &ae) {
		r := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/mcp"}, Header: http.Header{}}).WithContext(ctx)
		if runID != "" {
			ae = b.s.runError(r, runID, err)
		} else {
			ae = b.s.unavailableOrInternal(r, err)
		}
	}
	return refusal(ae)
}
