// The official TypeScript SDK of MCP as a client of agenthost's /mcp:
// node client.mjs URL TOKEN OTHER_TOKEN. It lists the tools, calls an
// agent as a task and polls tasks/get to its result, calls one whose Run
// waits for an approval as a task (the SDK's callToolStream: on
// input_required it calls tasks/result, and the server asks for the
// approval by elicitation, which this client grants), and asks for the
// first task with another tenant's token. It prints one JSON line of what
// it saw; npm_test.go checks it. Any failure exits non-zero.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, token, otherToken] = process.argv.slice(2);

async function connect(bearer, onElicit) {
  const client = new Client({ name: 'agenthost-ts-test', version: '1.0.0' }, { capabilities: { elicitation: {} } });
  client.setRequestHandler(ElicitRequestSchema, async (req) => onElicit(req.params));
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
  });
  await client.connect(transport);
  return client;
}

const seen = { elicitations: [], statuses: [] };
const client = await connect(token, (params) => {
  seen.elicitations.push(params.message);
  return { action: 'accept', content: { approved: true, reason: 'granted by the TypeScript client' } };
});
seen.tasksCapability = client.getServerCapabilities()?.tasks ?? null;

const { tools } = await client.listTools();
seen.tools = tools.map((t) => ({ name: t.name, taskSupport: t.execution?.taskSupport ?? null, outputSchema: !!t.outputSchema }));

// A task polled with tasks/get to its end, then its result.
const stream = client.experimental.tasks.callToolStream({ name: 'default', arguments: { question: 'answer:hello from a task' } });
let taskId;
for await (const msg of stream) {
  if (msg.type === 'taskCreated') {
    taskId = msg.task.taskId;
    break; // poll it ourselves below
  }
  if (msg.type === 'error') throw msg.error;
}
let task;
for (;;) {
  task = await client.experimental.tasks.getTask(taskId);
  seen.statuses.push(task.status);
  if (['completed', 'failed', 'cancelled'].includes(task.status)) break;
  await new Promise((r) => setTimeout(r, Math.min(task.pollInterval ?? 100, 100)));
}
seen.task = { taskId, status: task.status, ttl: task.ttl };
const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
seen.result = { text: result.content[0].text, isError: !!result.isError, related: result._meta?.['io.modelcontextprotocol/related-task']?.taskId };

// A task whose Run waits for an approval: the SDK's stream goes through
// input_required to tasks/result, which asks this client by elicitation.
const gated = [];
for await (const msg of client.experimental.tasks.callToolStream({
  name: 'default',
  arguments: { question: 'call:wire({"text":"approved"})|answer:wired $results' },
})) {
  if (msg.type === 'error') throw msg.error;
  gated.push(msg.type === 'result' ? { type: 'result', text: msg.result.content[0].text } : { type: msg.type, status: msg.task?.status });
}
seen.gated = gated;

// Another tenant asks for the first task, and for one that does not exist.
const other = await connect(otherToken, () => ({ action: 'cancel' }));
const refusal = async (id) => {
  try {
    await other.experimental.tasks.getTask(id);
    return null;
  } catch (e) {
    return { code: e.code, message: e.message };
  }
};
seen.otherTenant = await refusal(taskId);
seen.unknown = await refusal('run_0000000000000_nosuchrun');

const listed = await client.experimental.tasks.listTasks();
seen.listed = listed.tasks.map((t) => t.taskId);

await client.close();
await other.close();
console.log(JSON.stringify(seen));
