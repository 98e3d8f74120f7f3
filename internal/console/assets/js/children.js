// children.js: what a Run's page shows of the Runs it is linked to when
// agents call agents as tools: the parent of a child Run, and the child
// Runs of a parent, each with its status and what it waits a person for
// (pure, so that node tests it; run.js reads the Runs and draws them).
//
// A child Run is read with GET /v1/runs/{child}, and what it is known
// as is kept as a "got": undefined (not read yet), {run} (the Run the
// API gave), {missing: true} (the API answered 404), or {error} (the read
// failed; error is its message). A child is listed on its parent as soon
// as its attempt is dispatched, a moment before the attempt's start
// creates it: a 404 then means "starting", not an error.

// CHILDREN_SHOWN is how many child Runs a parent's page reads and lists:
// the last ones (one per attempt of each agent tool call), so that a Run
// with many calls costs a bounded number of reads.
export const CHILDREN_SHOWN = 20;

// childrenShown returns the children a parent's page reads and lists:
// the last limit of run.children, in the order they were started.
export function childrenShown(children, limit = CHILDREN_SHOWN) {
  const list = Array.isArray(children) ? children : [];
  return list.slice(Math.max(0, list.length - limit));
}

// ended says whether a Run the API gave has ended: only a Run that has
// not has waiting.
export function ended(run) {
  return !!run && !run.waiting;
}

// childStatus is the status a child shows: its Run's once read;
// "starting" while the API does not have it yet and its parent is live,
// "not started" when its parent ended before it was created (a cancel
// that came first); "unknown" when it could not be read; "" before the
// first read.
export function childStatus(got, parentEnded) {
  if (!got) return '';
  if (got.run) return got.run.status;
  if (got.missing) return parentEnded ? 'not started' : 'starting';
  return 'unknown';
}

// childWait says what a child Run waits a person for ("research waits
// for your approval of slow_job"), or '' when it waits for nobody: the
// tool calls in its waiting.approvals, and its model's question in
// waiting.input. The page adds the link to the child, where it is
// answered.
export function childWait(agent, run) {
  const w = run && run.waiting;
  if (!w) return '';
  const bits = [];
  const approvals = Array.isArray(w.approvals) ? w.approvals : [];
  if (approvals.length) bits.push('your approval of ' + namesText(approvals.map(a => a.tool || a.tool_call_id || 'a tool')));
  if (w.input) bits.push('your answer to "' + clip(String(w.input.prompt || ''), 120) + '"');
  if (!bits.length) return '';
  return (agent || 'a child Run') + ' waits for ' + bits.join(' and ');
}

// parentNote is what follows the link to a child's parent: "(call
// call_1_1, depth 1)".
export function parentNote(parent) {
  if (!parent) return '';
  const bits = [];
  if (parent.tool_call_id) bits.push('call ' + parent.tool_call_id);
  bits.push('depth ' + (parent.depth || 1));
  return '(' + bits.join(', ') + ')';
}

// childrenToRead returns the IDs of the shown children whose state can
// still change, which the page reads again: every one not read yet or
// not ended; of the ones the API did not have, only while the parent is
// live (a parent that has ended starts no more of them).
export function childrenToRead(shown, got, parentEnded) {
  const out = [];
  for (const c of shown) {
    const g = got.get(c.run);
    if (g && g.run && ended(g.run)) continue;
    if (g && g.missing && parentEnded) continue;
    out.push(c.run);
  }
  return out;
}

// namesText lists names in words, a repeated one once with its count:
// "calculate", "calculate and slow_job", "calculate (2 calls), a and b".
export function namesText(names) {
  const counts = new Map();
  for (const n of names) counts.set(n, (counts.get(n) || 0) + 1);
  const items = [...counts].map(([n, k]) => (k > 1 ? n + ' (' + k + ' calls)' : n));
  if (items.length <= 1) return items.join('');
  return items.slice(0, -1).join(', ') + ' and ' + items[items.length - 1];
}

function clip(s, n) {
  return s.length > n ? s.slice(0, n - 1) + '…' : s;
}
