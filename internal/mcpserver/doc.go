// Package mcpserver serves a tenant's agents as tools over the Model
// Context Protocol (MCP), at /mcp of the HTTP API (docs/OPERATIONS.md,
// "MCP"). The protocol and its streamable HTTP transport are the official
// Go SDK's (github.com/modelcontextprotocol/go-sdk); this package adds the
// tools, and the tasks of protocol revision 2025-11-25, which the SDK
// does not implement, on its hooks: receiving middleware and custom
// methods.
//
// # Tools
//
// Each agent of the tenant is a tool of the same name. Its input is
// {"question": string, "session": string (optional)}; its output schema
// is the agent's output_schema when that is a JSON object schema. A call
// submits a Run, as POST /v1/sessions/{session}/runs does (Backend.Submit:
// the same checks, rates and quotas), in the session named, or in a
// session of its own ("mcp-" and a random suffix).
//
// Without a task, tools/call waits for the Run's end, following it
// (Backend.Follow), and answers its result; with a progress token it
// sends a progress notification for each event of the Run, the first of
// which names the Run. The result's _meta carries the Run's ID under
// "agenthost/run", so a client that lost the connection fetches the
// result with tasks/result or GET /v1/runs/{id}.
//
// # Tasks
//
// A tools/call with "task" in its params answers at once with a task
// whose ID is the Run's ID. Every task answer is read from the store
// (Backend.LoadRun), so any node answers for any task, and a task
// survives the node that accepted it: there is no table of tasks in
// memory. The Run's status maps to the task's:
//
//	pending, running                       working
//	waiting (for an approval or an answer) input_required
//	completed, failed, cancelled           completed, failed, cancelled
//
// tasks/get answers the task, tasks/result waits for the Run's end and
// answers its result as the tool's (isError for a failed or cancelled
// Run), tasks/cancel cancels the Run, and tasks/list lists the tenant's
// Runs, newest first. Another tenant's task ID answers "task not found"
// exactly as an unknown one.
//
// A Run waiting for a person is answered through POST /v1/runs/{id}/input,
// or, when the client declared the elicitation capability, through an
// elicitation that tools/call (without a task) or tasks/result sends while
// it waits: a form asking for the approval or the answer.
//
// # Wire
//
// The SDK's types lack the fields of tasks, so three messages are edited
// as JSON: the "task" of a tools/call's params is moved into its _meta
// before the SDK decodes it (mcptasks.LiftRequestTasks, which the client
// side shares; the task types are mcptasks' too), the initialize result gains
// capabilities.tasks, and each tool of tools/list gains
// execution.taskSupport "optional". The server speaks the revisions up to
// 2025-11-25, whose tasks these are; a client asking for a later one is
// answered with 2025-11-25.
package mcpserver
