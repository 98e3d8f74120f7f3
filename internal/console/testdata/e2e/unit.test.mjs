// Unit tests of the console's modules that need no browser: the SSE
// parser, the stream's resume and dedupe, the fold of a Run's events and
// of a model's answer as it streams in, the
// routes read from the URL's fragment, the agents' helpers, and what a
// parent Run's page shows of its child Runs.
// Run with node --test (internal/console's
// TestTheModulesUnderNode does).

import {test} from 'node:test';
import assert from 'node:assert/strict';
import {SSEParser, EventStream} from '../../assets/js/sse.js';
import {RunView, effectRef} from '../../assets/js/runview.js';
import {parseRoute, listHash, agentHash} from '../../assets/js/route.js';
import {chooseAgent, settingsText, limitsText} from '../../assets/js/agents.js';
import {childrenShown, childStatus, childWait, childrenToRead, parentNote, namesText, ended, CHILDREN_SHOWN} from '../../assets/js/children.js';

function parse(chunks) {
  const out = [];
  const p = new SSEParser(m => out.push(m));
  for (const c of chunks) p.push(c);
  return out;
}

test('the parser reads events split anywhere, CRLF or LF, comments and retry', () => {
  const text = 'retry: 2000\n\n: heartbeat\n\nid: 1\nevent: run_created\ndata: {"a":\ndata: 1}\n\r\nid: 2\r\nevent: run_started\r\ndata: {}\r\n\r\nevent: progress\ndata: {"type":"x"}\n\n';
  const whole = parse([text]);
  assert.deepEqual(whole, [
    {retry: 2000},
    {id: '1', event: 'run_created', data: '{"a":\n1}'},
    {id: '2', event: 'run_started', data: '{}'},
    {id: undefined, event: 'progress', data: '{"type":"x"}'},
  ]);
  // Byte by byte (a \r\n split between chunks included) gives the same.
  assert.deepEqual(parse(text.split('')), whole);
  // An event not yet ended by a blank line is not delivered.
  assert.deepEqual(parse(['id: 3\nevent: x\ndata: {}\n']), []);
});

// A stream whose loop does not run: dispatch is fed by hand.
function stream(from) {
  const got = [], deltas = [];
  const s = Object.create(EventStream.prototype);
  Object.assign(s, {runID: 'r', lastID: from, retryMS: 2000, ended: false, closed: false,
    on: {event: e => got.push(e.id), progress: () => {}, delta: d => deltas.push(d), state: () => {}}});
  return {s, got, deltas};
}

test('a resumed stream delivers each event once, in order, and ends at the terminal one', () => {
  const {s, got} = stream(0);
  for (const id of [1, 2, 3]) s.dispatch({id: String(id), event: 'x', data: '{}'});
  // After a reconnect with Last-Event-ID 3, a server that replayed would
  // send 2 and 3 again: they are dropped.
  for (const id of [2, 3, 4]) s.dispatch({id: String(id), event: 'x', data: '{}'});
  s.dispatch({id: undefined, event: 'progress', data: '{}'});
  s.dispatch({id: '5', event: 'run_completed', data: '{}'});
  assert.deepEqual(got, [1, 2, 3, 4, 5]);
  assert.equal(s.lastID, 5);
  assert.equal(s.ended, true);
  s.dispatch({retry: 500});
  assert.equal(s.retryMS, 500);
});

test('a model_delta is handed on as it comes and leaves the event ids alone', () => {
  const {s, got, deltas} = stream(0);
  s.dispatch({id: '1', event: 'effect_dispatched', data: '{}'});
  s.dispatch({id: undefined, event: 'model_delta', data: '{"effect":"r.m1","attempt":1,"seq":1,"text":"Hel"}'});
  s.dispatch({id: undefined, event: 'model_delta', data: '{"effect":"r.m1","attempt":1,"seq":2,"text":"lo"}'});
  assert.equal(s.lastID, 1, 'a delta has no id: a resume still starts after the last event');
  s.dispatch({id: '2', event: 'effect_settled', data: '{}'});
  assert.deepEqual(got, [1, 2]);
  assert.deepEqual(deltas.map(d => d.text), ['Hel', 'lo']);
  // A stream whose page takes no deltas drops them.
  delete s.on.delta;
  s.dispatch({id: undefined, event: 'model_delta', data: '{}'});
  assert.equal(deltas.length, 2);
});

test('the deltas fold into the answer being formed, until the committed reply replaces it', () => {
  const run = 'run_d', m1 = run + '.m1';
  const v = new RunView();
  let id = 0;
  const apply = (type, data) => v.apply({id: ++id, type, data});
  const delta = (attempt, seq, more) => v.delta({effect: m1, plugin: 'openai', attempt, seq, ...more});
  apply('run_created', {at: 1000, spec: {input: 'hi'}});
  apply('model_step_planned', {at: 1001, step: 1});
  apply('effect_dispatched', {at: 1002, effect: m1, attempt: 1});
  delta(1, 1, {text: 'The '});
  delta(1, 2, {text: 'wate'});
  delta(1, 4, {text: 'r bo'}); // seq 3 was dropped: the gap is left as it is
  delta(1, 5, {tool_calls: [{index: 0, id: 'call_1', name: 'calculate', arguments: ''}]});
  delta(1, 6, {tool_calls: [{index: 0, arguments: '{"exp'}]});
  delta(1, 7, {tool_calls: [{index: 0, arguments: 'ression":"6*7"}'}]});
  let l = v.answering(1);
  assert.deepEqual([l.attempt, l.seq, l.text, l.plugin], [1, 7, 'The water bo', 'openai']);
  assert.deepEqual(l.calls, [{index: 0, id: 'call_1', name: 'calculate', arguments: '{"expression":"6*7"}'}]);
  assert.equal(v.answering(2), null);

  // The attempt fails; the next one starts its answer again, and a late
  // piece of the first is dropped.
  apply('effect_settled', {at: 1100, effect: m1, attempt: 1, outcome: {state: 'failed', error: {class: 'plugin_error', message: 'cut', retriable: true}}});
  assert.equal(v.answering(1), null, 'the settled attempt shows no more');
  assert.equal(delta(1, 8, {text: 'late'}), null);
  apply('effect_dispatched', {at: 1200, effect: m1, attempt: 2});
  delta(2, 1, {text: 'Again'});
  assert.equal(delta(1, 9, {text: 'stale'}), null);
  l = v.answering(1);
  assert.deepEqual([l.attempt, l.text, l.calls], [2, 'Again', []]);
  // A third attempt's first piece, before its dispatch is seen, resets it too.
  delta(3, 1, {text: 'Third'});
  assert.deepEqual([v.answering(1).attempt, v.answering(1).text], [3, 'Third']);

  // The committed reply replaces the deltas; nothing more is shown.
  apply('effect_settled', {at: 1300, effect: m1, attempt: 3, outcome: {state: 'done', model: {message: {role: 'assistant', content: 'The water boils.'}}}});
  assert.equal(v.answering(1), null);
  assert.equal(v.steps.get(1).content, 'The water boils.');
  assert.equal(delta(3, 2, {text: 'x'}), null);
  // Deltas of something else than a model effect, or of an ended Run, are dropped.
  assert.equal(v.delta({effect: run + '.t1.0', attempt: 1, seq: 1, text: 'x'}), null);
  assert.equal(v.delta(null), null);
  apply('model_step_planned', {at: 1400, step: 2});
  v.delta({effect: run + '.m2', attempt: 1, seq: 1, text: 'half'});
  assert.equal(v.answering(2).text, 'half');
  apply('run_cancelled', {at: 1500});
  assert.equal(v.answering(2), null);
  assert.equal(v.delta({effect: run + '.m2', attempt: 1, seq: 2, text: 'more'}), null);
});

test('the fold shows the calls of a step with their results, approvals and the answer', () => {
  const run = 'run_x';
  const v = new RunView();
  const evs = [
    {type: 'run_created', data: {at: 1000, spec: {input: 'What is 2+3 and 4*5?'}}},
    {type: 'model_step_planned', data: {at: 1001, step: 1}},
    {type: 'effect_dispatched', data: {at: 1002, effect: run + '.m1', attempt: 1}},
    {type: 'effect_settled', data: {at: 1010, effect: run + '.m1', attempt: 1, outcome: {state: 'done', model: {message: {role: 'assistant',
      tool_calls: [{id: 'call_1_1', name: 'calculate', arguments: {expression: '2+3'}}, {id: 'call_1_2', name: 'calculate', arguments: {expression: '4*5'}}]}}}}},
    {type: 'approval_recorded', data: {at: 1100, approvals: [{tool_call_id: 'call_1_2', approved: false, reason: 'no'}]}},
    {type: 'approval_recorded', data: {at: 1200, approvals: [{tool_call_id: 'call_1_1', approved: true}]}},
    {type: 'effect_dispatched', data: {at: 1201, effect: run + '.t1.0', attempt: 1}},
    {type: 'effect_settled', data: {at: 1300, effect: run + '.t1.0', attempt: 1, outcome: {state: 'failed', error: {class: 'plugin_error', message: 'boom', retriable: true}}}},
    {type: 'effect_dispatched', data: {at: 1400, effect: run + '.t1.0', attempt: 2}},
    {type: 'effect_settled', data: {at: 1450, effect: run + '.t1.0', attempt: 2, outcome: {state: 'done', tool: {content: '5'}}}},
    {type: 'run_completed', data: {at: 1500, result: 'done'}},
  ];
  evs.forEach((e, i) => v.apply({id: i + 1, ...e}));
  const step = v.steps.get(1);
  assert.deepEqual(step.calls, [run + '.t1.0', run + '.t1.1']);
  const ok = v.effects.get(run + '.t1.0'), denied = v.effects.get(run + '.t1.1');
  assert.equal(ok.callID, 'call_1_1');
  assert.deepEqual(ok.attempts.map(a => [a.attempt, a.state, a.error && a.error.class]), [[1, 'failed', 'plugin_error'], [2, 'done', null]]);
  assert.equal(ok.outcome.tool.content, '5');
  assert.equal(denied.approval.approved, false);
  assert.equal(denied.outcome.error.class, 'approval_denied');
  assert.match(denied.outcome.error.message, /denied: no/);
  assert.deepEqual(v.items.map(i => i.kind), ['user', 'step', 'final']);
  const tl = v.timeline(2000);
  // The denied call is on the timeline too, where it ended, as not run.
  assert.deepEqual(tl.map(r => [r.label, r.duration, r.attempts, r.notRun || '']),
    [['model step 1', 8, 1, ''], ['calculate (call_1_1)', 249, 2, ''], ['calculate (call_1_2)', 0, 0, 'approval_denied']]);
  assert.equal(tl[2].start, 1100);
  assert.deepEqual(effectRef('run_x.t2.3'), {kind: 'tool', step: 2, index: 3});
  assert.equal(effectRef('run_x.q1'), null);
});

test('a call the host settled without running it gets its result from the next request', () => {
  const run = 'run_y';
  const v = new RunView();
  const evs = [
    {type: 'run_created', data: {at: 1000, spec: {input: 'use word_count {"text":3}'}}},
    {type: 'model_step_planned', data: {at: 1001, step: 1}},
    {type: 'effect_dispatched', data: {at: 1002, effect: run + '.m1', attempt: 1}},
    {type: 'effect_settled', data: {at: 1010, effect: run + '.m1', attempt: 1, outcome: {state: 'done', model: {message: {role: 'assistant',
      tool_calls: [{id: 'c1', name: 'word_count', arguments: {text: 3}}]}}}}},
    {type: 'model_step_planned', data: {at: 1011, step: 2, request: {messages: [
      {role: 'user', content: 'use word_count {"text":3}'},
      {role: 'assistant', content: '', tool_calls: [{id: 'c1', name: 'word_count', arguments: {text: 3}}]},
      {role: 'tool', tool_call_id: 'c1', is_error: true,
        content: 'error (invalid_arguments): tool word_count was not called: its arguments do not match its input_schema: at /text: got number, want string'}]}}},
  ];
  evs.forEach((e, i) => v.apply({id: i + 1, ...e}));
  const e = v.effects.get(run + '.t1.0');
  assert.equal(e.attempts.length, 0);
  assert.equal(e.outcome.state, 'failed');
  assert.equal(e.outcome.error.class, 'invalid_arguments');
  assert.match(e.outcome.error.message, /^tool word_count was not called/);
  assert.deepEqual(v.timeline(2000).map(r => [r.label, r.notRun || '']), [['model step 1', ''], ['word_count (c1)', 'invalid_arguments']]);
});

// A local server whose event stream breaks off: the stream resumes with
// Last-Event-ID, and ends at the terminal event; one of a Run whose log
// was pruned ends when the Run is found ended.
test('the stream resumes after a break with Last-Event-ID, and ends on a pruned log', async () => {
  const http = await import('node:http');
  globalThis.sessionStorage = new Map([['agenthost.token', 't0ken']]);
  globalThis.sessionStorage.getItem = globalThis.sessionStorage.get;
  const seen = []; // [Last-Event-ID, Authorization] of each request
  const server = http.createServer((req, res) => {
    seen.push([req.headers['last-event-id'] || '', req.headers.authorization, req.url]);
    res.writeHead(200, {'Content-Type': 'text/event-stream'});
    const send = (id, type) => res.write('id: ' + id + '\nevent: ' + type + '\ndata: {"at":' + id + '}\n\n');
    if (req.url.includes('pruned')) return res.end('retry: 10\n\n');
    if (seen.length === 1) { res.write('retry: 10\n\n'); send(1, 'run_created'); send(2, 'run_started'); res.end(); return; }
    send(3, 'model_step_planned'); send(4, 'run_completed'); res.end();
  });
  await new Promise(r => server.listen(0, '127.0.0.1', r));
  const base = 'http://127.0.0.1:' + server.address().port;
  try {
    const follow = (id, terminal) => new Promise((resolve) => {
      const got = [], states = [];
      const s = new EventStream(id, {event: e => got.push(e.id), progress: () => {},
        state: st => { states.push(st); if (st === 'ended' || st === 'error') resolve({got, states, s}); }},
      {base, isTerminal: async () => terminal});
    });
    const a = await follow('run_a', false);
    assert.deepEqual(a.got, [1, 2, 3, 4]);
    assert.ok(a.states.includes('reconnecting'));
    assert.equal(a.s.reconnects, 1);
    assert.deepEqual(seen.map(x => x[0]), ['', '2'], 'the second request resumed after event 2');
    assert.ok(seen.every(x => x[1] === 'Bearer t0ken' && !x[2].includes('t0ken')), 'the token goes in the header only');
    const p = await follow('run_pruned', true);
    assert.deepEqual(p.got, []);
    assert.equal(p.s.pruned, true);
  } finally {
    server.close();
    delete globalThis.sessionStorage;
  }
});

test('a route reads its IDs, and a malformed fragment is an invalid link, not an exception', () => {
  assert.deepEqual(
    (({page, id}) => ({page, id}))(parseRoute('#/runs/run%2Fa%20b')), {page: 'run', id: 'run/a b'});
  assert.equal(parseRoute('#/sessions/s%C3%A9').id, 'sé');
  assert.equal(parseRoute('').page, 'runs');
  assert.equal(parseRoute('#/signin').page, 'signin');
  const list = parseRoute('#/runs?status=failed&page=20');
  assert.equal(list.page, 'runs');
  assert.equal(list.status, 'failed');
  assert.equal(list.size, 20);
  assert.equal(parseRoute('#/runs?page=9000').size, undefined);

  // Cut short in the middle of a percent-encoded character: what
  // decodeURIComponent throws on.
  const bad = parseRoute('#/runs/%E0%A4%A');
  assert.equal(bad.page, 'invalid');
  assert.equal(bad.what, 'Run');
  assert.match(bad.message, /not a valid Run link/);
  assert.match(bad.message, /%E0%A4%A/);
  const badSession = parseRoute('#/sessions/%ZZ');
  assert.equal(badSession.page, 'invalid');
  assert.match(badSession.message, /not a valid session link/);
});

test('the agents\' routes, and a list\'s filters written into its route and read back', () => {
  assert.equal(parseRoute('#/agents').page, 'agents');
  const one = parseRoute(agentHash('research team'));
  assert.deepEqual([one.page, one.id], ['agent', 'research team']);
  assert.equal(agentHash('a/b'), '#/agents/a%2Fb');
  const bad = parseRoute('#/agents/%E0%A4%A');
  assert.equal(bad.page, 'invalid');
  assert.match(bad.message, /not a valid agent link/);
  assert.match(bad.message, /list of agents/);

  assert.equal(listHash('#/runs', {}), '#/runs');
  assert.equal(listHash('#/runs', {status: '', agent: ''}), '#/runs');
  const h = listHash('#/runs', {status: 'waiting', agent: 'support', size: 20});
  assert.equal(h, '#/runs?status=waiting&agent=support&page=20');
  const r = parseRoute(h);
  assert.deepEqual([r.page, r.status, r.agent, r.size], ['runs', 'waiting', 'support', 20]);
  // A session's list keeps its ID and takes the same filters.
  const s = parseRoute(listHash('#/sessions/' + encodeURIComponent('s 1'), {agent: 'a&b=c'}));
  assert.deepEqual([s.page, s.id, s.agent, s.status], ['session', 's 1', 'a&b=c', '']);
  assert.equal(parseRoute('#/runs').agent, '');
});

test('a new Run\'s agent is the filtered one, else default, else the first', () => {
  assert.equal(chooseAgent(['alpha', 'default', 'research'], ''), 'default');
  assert.equal(chooseAgent(['alpha', 'default', 'research'], 'research'), 'research');
  assert.equal(chooseAgent(['alpha', 'default'], 'gone'), 'default');
  assert.equal(chooseAgent(['support', 'research'], ''), 'support');
  assert.equal(chooseAgent([], 'x'), '');
});

test('an agent\'s settings and limits are one line of text', () => {
  assert.equal(settingsText(undefined), 'none');
  assert.equal(settingsText({}), 'none');
  assert.equal(settingsText({model: 'gpt-4o', temperature: 0.2, stop: ['x'], extra: {a: 1}}),
    'model: gpt-4o, temperature: 0.2, stop: ["x"], extra: {"a":1}');
  assert.equal(limitsText({max_steps: 8, max_tool_calls_per_step: 4, max_parallel_tool_calls: 2, run_timeout: '0s', effect_timeout: '30s'}),
    '8 steps, 4 tool calls a step (2 at once), Run timeout none, effect timeout 30s');
});

// A Run as GET /v1/runs/{id} gives it: waiting is set until it ends.
const live = (waiting = {}) => ({status: 'running', waiting: {approvals: [], pending: [], queued: false, ...waiting}});

test('a child Run\'s status on its parent: the API\'s 404 is "starting" while the parent is live', () => {
  assert.equal(childStatus(undefined, false), '', 'not read yet');
  assert.equal(childStatus({missing: true}, false), 'starting', 'listed on its parent before its start created it');
  assert.equal(childStatus({missing: true}, true), 'not started', 'its parent ended before it was created');
  assert.equal(childStatus({run: {status: 'waiting', waiting: {approvals: []}}}, false), 'waiting');
  assert.equal(childStatus({run: {status: 'completed'}}, true), 'completed');
  assert.equal(childStatus({error: 'boom'}, false), 'unknown');
});

test('what a child Run waits a person for is said on its parent', () => {
  assert.equal(childWait('research', live({approvals: [{tool_call_id: 'call_1_1', tool: 'slow_job'}]})),
    'research waits for your approval of slow_job');
  assert.equal(childWait('helper', live({approvals: [{tool_call_id: 'call_1_1', tool: 'calculate'},
    {tool_call_id: 'call_1_2', tool: 'calculate'}, {tool_call_id: 'call_1_3', tool: 'slow_job'}]})),
  'helper waits for your approval of calculate (2 calls) and slow_job');
  assert.equal(childWait('helper', live({input: {prompt: 'Which city?'}})), 'helper waits for your answer to "Which city?"');
  assert.equal(childWait('helper', live({approvals: [{tool_call_id: 'c', tool: 'calculate'}], input: {prompt: 'x'}})),
    'helper waits for your approval of calculate and your answer to "x"');
  const long = childWait('helper', live({input: {prompt: 'y'.repeat(500)}}));
  assert.ok(long.length < 200 && long.endsWith('…"'), 'a long question is cut: ' + long.length);
  // Nothing for a person: running, waiting on a job or a timer, or ended.
  assert.equal(childWait('helper', live({pending: [{effect: 'x.t1.0'}]})), '');
  assert.equal(childWait('helper', {status: 'completed'}), '');
  assert.equal(childWait('helper', undefined), '');
  assert.equal(namesText([]), '');
  assert.equal(namesText(['a', 'b', 'c']), 'a, b and c');
});

test('a parent reads its last children, and only the ones that may still change', () => {
  const children = Array.from({length: CHILDREN_SHOWN + 5}, (_, i) => ({run: 'sub-' + i, agent: 'helper', attempt: 1}));
  const shown = childrenShown(children);
  assert.equal(shown.length, CHILDREN_SHOWN);
  assert.equal(shown[0].run, 'sub-5', 'the last ones, in the order they were started');
  assert.deepEqual(childrenShown(undefined), []);
  assert.deepEqual(childrenShown(children.slice(0, 2)).map(c => c.run), ['sub-0', 'sub-1']);

  const few = children.slice(0, 5);
  const got = new Map([
    ['sub-0', {run: {status: 'completed'}}],   // ended: read no more
    ['sub-1', {run: live({approvals: [{tool_call_id: 'c', tool: 'calculate'}]})}],
    ['sub-2', {missing: true}],                 // starting
    ['sub-3', {error: 'boom'}],
  ]);                                          // sub-4: not read yet
  assert.deepEqual(childrenToRead(few, got, false), ['sub-1', 'sub-2', 'sub-3', 'sub-4']);
  // Once the parent has ended, a child it never created will not come.
  assert.deepEqual(childrenToRead(few, got, true), ['sub-1', 'sub-3', 'sub-4']);
  assert.ok(ended({status: 'cancelled'}) && !ended(live()) && !ended(undefined));
});

test('a child Run names the call of its parent it answers', () => {
  assert.equal(parentNote({run: 'run_1', session: 's', tool_call_id: 'call_1_1', depth: 1}), '(call call_1_1, depth 1)');
  assert.equal(parentNote({run: 'run_1', session: 's', depth: 2}), '(depth 2)');
  assert.equal(parentNote(undefined), '');
});
