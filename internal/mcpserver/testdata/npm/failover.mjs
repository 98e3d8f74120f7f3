// The official TypeScript SDK of MCP, in two steps across nodes
// (cmd/agenthost's mcp_cluster_test.go runs it):
//
//   node failover.mjs create URL TOKEN TOOL QUESTION   calls the tool as a task, prints the task
//   node failover.mjs result URL TOKEN TASK_ID         polls tasks/get to the task's end, prints
//                                                      the statuses seen and tasks/result's answer
//
// Each step opens a session of its own: the second may reach another
// node than the first. Any failure exits non-zero.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const [step, url, token, ...rest] = process.argv.slice(2);
const client = new Client({ name: 'agenthost-failover-test', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
}));
await client.listTools(); // the SDK learns each tool's taskSupport

if (step === 'create') {
  const [tool, question] = rest;
  for await (const msg of client.experimental.tasks.callToolStream({ name: tool, arguments: { question } })) {
    if (msg.type === 'error') throw msg.error;
    if (msg.type === 'taskCreated') {
      console.log(JSON.stringify(msg.task));
      break;
    }
  }
} else if (step === 'result') {
  const [taskId] = rest;
  const statuses = [];
  let task;
  for (;;) {
    task = await client.experimental.tasks.getTask(taskId);
    if (statuses.at(-1) !== task.status) statuses.push(task.status);
    if (['completed', 'failed', 'cancelled'].includes(task.status)) break;
    await new Promise((r) => setTimeout(r, 200));
  }
  const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
  console.log(JSON.stringify({ statuses, status: task.status, text: result.content[0]?.text, isError: !!result.isError }));
} else {
  throw new Error(`unknown step ${step}`);
}
await client.close();
