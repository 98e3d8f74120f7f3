// Package httpapi is agenthost's HTTP API (docs/DESIGN.md §8): JSON over HTTP,
// with bearer tokens that map to tenants, served over a runtime.Runtime.
//
// Build a Server from a Config and serve its Handler:
//
//	auth, _ := httpapi.NewTokenAuthenticator(map[string][]string{"acme": {sha256hex}})
//	ledger := httpapi.NewUsageLedger() // also an Observer of the runtime
//	srv, _ := httpapi.New(httpapi.Config{Runtime: rt, Store: store, Auth: auth,
//		Quotas: quotas, Usage: ledger, Ready: rt.Ready, Metrics: m.Handler(), Logger: log})
//	http.Server{Handler: srv.Handler()}
//	…
//	srv.Drain() // on SIGTERM, before http.Server.Shutdown
//
// # Routes
//
//	POST /v1/sessions/{id}/runs   {"input": "...", "metadata": {}} → 201 Run
//	                              (Idempotency-Key: a replay → 200, same Run, Idempotent-Replayed: true)
//	GET  /v1/sessions/{id}/runs   ?after=<ordinal>&limit=<1..500, default 50> → 200 {"runs": [...], "next_after": n}
//	GET  /v1/whoami               → 200 {"tenant": "..."}: the tenant the token maps to
//	GET  /v1/runs                 ?status=<status>&agent=<name>&order=<oldest|newest>&after=<run id>&limit=<1..500, default 50>
//	                              → 200 {"runs": [...], "next_after": "<run id>"}: the tenant's Runs, oldest (or newest) first
//	GET  /v1/runs/{id}            → 200 Run (ETag: "<seq>")
//	GET  /v1/runs/{id}/events     Server-Sent Events; resumes after Last-Event-ID or ?after=
//	POST /v1/runs/{id}/input      {"approvals": [{"tool_call_id", "approved", "reason"}]} or {"message": "..."} → 200 Run
//	POST /v1/runs/{id}/cancel     optional {"reason": "..."} → 202 Run
//	                              (input and cancel take If-Match: "<seq>": 412 run_changed once the Run moved on)
//	POST, GET, DELETE /mcp        MCP's streamable HTTP transport: the tenant's agents as tools, with
//	                              tasks that are Runs (package mcpserver; mcp.go)
//	GET  /healthz                 200 while the process serves
//	GET  /readyz                  503 until Config.Ready says ready (recovery's first pass), then 200
//	GET  /metrics                 Config.Metrics (Prometheus)
//	GET  /console/                the web console (package console); GET / redirects there
//	GET  /v1/openapi.json         the OpenAPI 3.1 description of all of these (openapi.json)
//
// The /v1 routes and /mcp need "Authorization: Bearer TOKEN"; the probes and
// /metrics do not (expose them on a trusted network only), nor do the
// API's description and the console's static files, which call the /v1
// routes with the token the person signs in with.
//
// The route table (routeTable in server.go) is the one list of routes:
// the server registers it, and a test fails unless openapi.json
// describes each route and no other.
//
// A Run's JSON (RunJSON) has id, session, status (pending, running,
// waiting, completed, failed, cancelled), input, metadata, usage
// {input_tokens, output_tokens}, created_at and updated_at (RFC 3339, UTC,
// milliseconds), step, seq (its last event's ID), result.content once
// completed, failure {class, message} once failed or cancelled, and, while
// not terminal, waiting {approvals: [{tool_call_id, tool, arguments}],
// input: {prompt}, pending: [{effect, kind, tool}], wake_at, queued}.
//
// # Event streams
//
// Each committed event of the Run is sent as
//
//	id: <seq>
//	event: <type>           run_created, model_step_planned, effect_settled, …, run_completed
//	data: <the event as JSON>
//
// in order, none skipped, flushed one by one; the stream ends after the
// terminal event (run_completed, run_failed or run_cancelled). A plugin's
// progress (agenthost_emit) comes as "event: progress" without an id, and
// is not replayed on resume; so does a model's answer as it streams in,
// as "event: model_delta" (ModelDeltaJSON: effect, attempt, seq, text,
// tool_calls). Deltas are for people watching: the committed reply in
// effect_settled is the answer, and a reconnected stream gets the deltas
// from then on only. A ": heartbeat" comment comes every 15 s.
// Reconnect with Last-Event-ID (or ?after=) set to the last id received to
// get only the later events.
//
// # Errors
//
// Every failure answers {"error": {"code": "...", "message": "...",
// "request_id": "..."}}: the message says what is wrong and what to do.
// The main codes are below; openapi.json gives every code of every
// answer of each route.
//
//	400 bad_request, unknown_field, invalid_session   malformed body, unknown JSON field, bad session ID, bad query
//	401 unauthorized                                  no token, or one no tenant has
//	404 not_found, run_not_found, session_not_found   no such route; no such Run or session for this tenant
//	405 method_not_allowed                            (with Allow)
//	409 run_terminal, not_awaiting, unknown_tool_call the Run has ended; it does not wait for that; no such tool call
//	412 run_changed                                   the Run is past the version If-Match names; nothing written
//	413 body_too_large                                over Config.MaxBodyBytes (default 1 MiB)
//	429 quota_active_runs, quota_in_flight_effects, quota_token_budget (with Retry-After)
//	503 unavailable                                   stopping, draining, or the session is moving (with Retry-After)
//	500 internal                                      logged; the message reveals nothing internal
//
// Another tenant's Run or session answers 404 exactly as a missing one
// does, never 403. An approval naming a tool call the Run's current step
// does not have answers 409 unknown_tool_call: the ID is well-formed, and
// whether it names a tool call depends on the Run's state, like
// not_awaiting.
//
// Quotas (Quota) are checked when a Run is submitted, in this order: the
// token budget (UsageLedger), the effects in flight (Runtime.InFlight),
// and the active Runs (pending, running or waiting, counted through the
// store's status index). A submission whose Idempotency-Key replays an
// earlier one is checked too: retry it after Retry-After.
//
// Server is safe for concurrent use.
package httpapi
