// The console in a real browser: Debian's chromium, driven by
// playwright-core, against a real `agenthost serve` that
// cmd/agenthost/console_e2e_test.go started (it runs this script). It
// prints "RESTART" when it wants the server SIGKILLed and started again
// on the same store and port, and waits for "RESTARTED" on its stdin;
// "STREAM" when it watches the Run of agent "streamer", whose model (the
// openai example against a fake OpenAI) may then begin to answer
// ("STREAMING"); the fake holds the answer after its first two pieces
// until the script, having seen them, prints "RELEASE" ("RELEASED").
//
// Environment: CONSOLE_URL (http://127.0.0.1:PORT), DEMO_TOKEN (a tenant
// on the example plugins: prompt-builder, scripted-model, calculator whose
// calls wait for approval, slow-job; its agents are "default" with all of
// them, "research" with slow-job only, "lead" whose one tool is the agent
// "helper", "helper" with the calculator, whose calls wait for approval,
// and "streamer", with the openai example as its model and no tools),
// STREAMED_ANSWER (what streamer's model answers), ACME_TOKEN (a tenant on the
// conformance builder and scripted model, whose script is the input),
// SHOTS (a directory for a screenshot after each step), and CHROMIUM
// (the browser, /usr/bin/chromium by default). CONSOLE_SCREENSHOT, when
// set, is where the Run page's screenshot for docs/ goes.

import {chromium} from 'playwright-core';
import {createInterface} from 'node:readline';
import assert from 'node:assert/strict';
import path from 'node:path';

const base = process.env.CONSOLE_URL;
const demoToken = process.env.DEMO_TOKEN;
const acmeToken = process.env.ACME_TOKEN;
const shots = process.env.SHOTS;
const timeout = 20000;

const stdin = createInterface({input: process.stdin});
const lines = [];
let waiter = null;
stdin.on('line', l => { lines.push(l); if (waiter) { waiter(); waiter = null; } });
async function readLine() {
  while (!lines.length) await new Promise(r => { waiter = r; });
  return lines.shift();
}

// api calls the API from here (not the browser), as a tenant.
async function api(token, method, p, body, headers = {}) {
  const resp = await fetch(base + p, {method, headers: {Authorization: 'Bearer ' + token, 'Content-Type': 'application/json', ...headers},
    body: body === undefined ? undefined : JSON.stringify(body)});
  const text = await resp.text();
  return {status: resp.status, body: text ? JSON.parse(text) : null};
}

const browser = await chromium.launch({executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-background-networking', '--disable-dev-shm-usage']});
const context = await browser.newContext({viewport: {width: 1440, height: 1000}});
const page = await context.newPage();
page.setDefaultTimeout(timeout);
const dialogs = [];
const urls = [];     // every URL the page asked for
let bearer = 0;      // requests that carried a tenant token, in the Authorization header
page.on('request', r => {
  urls.push(r.url());
  const auth = r.headers()['authorization'] || '';
  if (auth === 'Bearer ' + demoToken || auth === 'Bearer ' + acmeToken) bearer++;
});
const problems = []; // script errors and CSP refusals on the page
page.on('dialog', d => { dialogs.push(d.message()); d.dismiss().catch(() => {}); });
page.on('pageerror', e => problems.push('page error: ' + e.message));
page.on('console', m => {
  if (m.type() === 'error' && !/Failed to load resource|net::ERR_/.test(m.text())) problems.push('console error: ' + m.text());
  if (/Content Security Policy/i.test(m.text())) problems.push('CSP: ' + m.text());
});

let n = 0;
async function shot(name) {
  n++;
  await page.screenshot({path: path.join(shots, String(n).padStart(2, '0') + '-' + name + '.png'), fullPage: true}).catch(() => {});
}

async function step(name, fn) {
  const started = Date.now();
  try {
    await fn();
  } finally {
    n++;
    await page.screenshot({path: path.join(shots, String(n).padStart(2, '0') + '-' + name + '.png'), fullPage: true}).catch(() => {});
  }
  console.log('ok  ' + name + ' (' + (Date.now() - started) + ' ms)');
}

async function signIn(token) {
  await page.goto(base + '/console/#/signin');
  if (await page.locator('#signout').isVisible()) {
    await page.click('#signout');
  }
  await page.fill('#token', token);
  await page.click('#signin-button');
  await page.waitForSelector('#start-form');
}

async function startRun(session, input) {
  await page.goto(base + '/console/#/runs');
  await page.fill('#start-session', session);
  await page.fill('#start-input', input);
  await page.click('#start-run');
  await page.waitForURL(/#\/runs\/run_/);
  await page.waitForSelector('#run-head h1');
  return decodeURIComponent(page.url().split('#/runs/')[1]);
}

async function waitStatus(status) {
  await page.waitForSelector('#run-head .badge.status-' + status);
}

// caughtUp waits until the page shows the Run at the version of the last
// event it has: it has read the Run again since its last event.
async function caughtUp() {
  await page.waitForFunction(() => {
    const rows = document.querySelectorAll('#event-log tr.ev');
    const seq = document.getElementById('run-seq');
    return rows.length > 0 && seq && seq.textContent === rows[rows.length - 1].dataset.seq;
  });
}

// eventSeqs returns the seq of every row of the event log, in order.
const eventSeqs = () => page.$$eval('#event-log tr.ev', rows => rows.map(r => Number(r.dataset.seq)));

async function checkLogWhole(token, runID) {
  const seqs = await eventSeqs();
  const run = (await api(token, 'GET', '/v1/runs/' + runID)).body;
  assert.deepEqual(seqs, Array.from({length: run.seq}, (_, i) => i + 1),
    'the event log shows each of the Run\'s ' + run.seq + ' events once, in order');
}

let demoRun = '';
try {
  await step('sign-in', async () => {
    const resp = await page.goto(base + '/');
    assert.ok(page.url().endsWith('/console/'), '/ leads to the console: ' + page.url());
    const h = resp.headers();
    assert.match(h['content-security-policy'] || '', /script-src 'self'/);
    assert.match(h['content-security-policy'], /frame-ancestors 'none'/);
    assert.equal(h['x-frame-options'], 'DENY');
    assert.equal(h['x-content-type-options'], 'nosniff');
    assert.equal(h['referrer-policy'], 'no-referrer');
    await page.waitForSelector('#signin-form');
    await page.fill('#token', 'not-a-token');
    await page.click('#signin-button');
    await page.waitForSelector('#signin-error:not([hidden])');
    assert.match(await page.textContent('#signin-error'), /not accepted/);
    await shot('sign-in-refused');
    await page.fill('#token', demoToken);
    await page.click('#signin-button');
    await page.waitForSelector('#start-form');
    assert.equal(await page.evaluate(() => sessionStorage.getItem('agenthost.token')), demoToken);
    assert.equal(await page.evaluate(() => localStorage.length), 0, 'nothing in localStorage');
    assert.ok(!page.url().includes(demoToken), 'the token is not in the URL');
    await page.waitForSelector('#tenant:text("tenant demo")');
  });

  await step('start-a-run-and-watch-it-live', async () => {
    demoRun = await startRun('live', 'run a slow job for 2 seconds');
    await page.waitForSelector('#connection.conn-live, #connection.conn-ended');
    // The job's pending event is on the page while the Run still runs:
    // the view is live, not read once at the end.
    await page.waitForSelector('#event-log tr.ev[data-type=effect_pending]');
    assert.equal(await page.locator('#event-log tr.ev[data-type=run_completed]').count(), 0,
      'the Run had not completed when its job was pending');
    await waitStatus('completed');
    await page.waitForSelector('#final-answer');
    assert.match(await page.textContent('#final-answer'), /slow_job tool answered/);
    await page.waitForSelector('#connection.conn-ended');
    await checkLogWhole(demoToken, demoRun);
    await page.waitForSelector('#timeline .tl-row');
    assert.ok(await page.locator('#timeline .tl-row').count() >= 3, 'the timeline shows the model steps and the job');
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#runs-body tr[data-run="' + demoRun + '"][data-status=completed]');
  });

  await step('the-list-is-live-filtered-and-by-session', async () => {
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#runs-body tr[data-run="' + demoRun + '"]');
    // A Run started elsewhere shows up, and changes status, on the open page.
    const r = await api(demoToken, 'POST', '/v1/sessions/elsewhere/runs', {input: 'run a slow job for 1 seconds'});
    assert.equal(r.status, 201);
    await page.waitForSelector('#runs-body tr[data-run="' + r.body.id + '"]');
    await page.waitForSelector('#runs-body tr[data-run="' + r.body.id + '"][data-status=completed]');
    // Newest first: the Run started later is above the earlier one.
    const listed = await page.locator('#runs-body tr.run').evaluateAll(rows => rows.map(x => x.dataset.run));
    assert.ok(listed.indexOf(demoRun) >= 0 && listed.indexOf(r.body.id) < listed.indexOf(demoRun),
      'the Run started later (' + r.body.id + ') is above ' + demoRun + ': ' + listed.join(' '));
    assert.match(await page.textContent('#runs-state'), /newest first/);
    await page.waitForSelector('#sessions-body tr[data-session=elsewhere]');
    await page.selectOption('#status-filter', 'waiting');
    await page.waitForURL(/status=waiting/);
    await page.waitForSelector('#runs-state:text("No Runs waiting")');
    assert.equal(await page.locator('#runs-body tr.run').count(), 0);
    await page.selectOption('#status-filter', 'completed');
    await page.waitForSelector('#runs-body tr[data-run="' + r.body.id + '"]');
    assert.equal(await page.locator('#runs-body tr.run:not([data-status=completed])').count(), 0);
    await page.click('#sessions-body tr[data-session=elsewhere] a');
    await page.waitForSelector('h2:text("Runs of session elsewhere")');
    // Its list is read after its heading is drawn: wait for its Run.
    await page.waitForSelector('#runs-body tr[data-run="' + r.body.id + '"]');
    assert.deepEqual(await page.locator('#runs-body tr.run').evaluateAll(rows => rows.map(x => x.dataset.run)), [r.body.id]);
    assert.equal(await page.inputValue('#start-session'), 'elsewhere');
  });

  await step('the-agents-and-a-run-with-a-chosen-agent', async () => {
    const listed = (await api(demoToken, 'GET', '/v1/agents')).body.agents;
    const version = Object.fromEntries(listed.map(a => [a.name, a.version]));
    assert.deepEqual(Object.keys(version), ['default', 'helper', 'lead', 'research', 'streamer']);
    assert.notEqual(version.default, version.research);
    // The header leads to the agents; each shows its version, model,
    // settings and tools with their approval.
    await page.goto(base + '/console/#/runs');
    await page.click('#nav-agents');
    await page.waitForURL(/#\/agents$/);
    await page.waitForSelector('#agents-state:text("5 agents.")');
    const rows = await page.locator('#agents-body tr.agent').evaluateAll(trs => trs.map(tr => ({
      name: tr.dataset.agent,
      version: tr.querySelector('.agent-version').textContent,
      model: tr.querySelector('.agent-model').textContent,
      settings: tr.querySelector('.agent-settings').textContent,
      description: tr.querySelector('.agent-description').textContent,
      tools: [...tr.querySelectorAll('.tool')].map(t => t.dataset.tool + ':' + t.dataset.approval),
    })));
    assert.deepEqual(rows, [
      {name: 'default', version: version.default, model: 'scripted-model', settings: 'none', description: '',
        tools: ['calculate:always', 'slow_job:never']},
      {name: 'helper', version: version.helper, model: 'scripted-model', settings: 'none', description: '',
        tools: ['calculate:always']},
      {name: 'lead', version: version.lead, model: 'scripted-model', settings: 'none', description: 'Hands the work to helper.',
        tools: ['helper:never']},
      {name: 'research', version: version.research, model: 'scripted-model',
        settings: 'model: research-model, temperature: 0.9', description: 'Looks things up, slowly.', tools: ['slow_job:never']},
      {name: 'streamer', version: version.streamer, model: 'openai', settings: 'none', description: 'Answers as the words come.', tools: []},
    ]);
    // An agent tool shows the agent it calls, with its link.
    const agentTool = '#agents-body tr[data-agent=lead] .tool[data-tool=helper][data-agent=helper]';
    assert.equal(await page.textContent(agentTool + ' .tool-by'), '(agent helper)');
    await page.click(agentTool + ' a.tool-agent');
    await page.waitForURL(/#\/agents\/helper$/);
    await page.goto(base + '/console/#/agents/lead');
    await page.waitForSelector('#agent-detail tr[data-tool=helper] a.tool-agent:text-is("helper")');
    // Selecting one shows its instructions.
    await page.click('#agents-body tr[data-agent=research] a.agent-name');
    await page.waitForURL(/#\/agents\/research$/);
    await page.waitForSelector('#agent-instructions');
    assert.equal(await page.textContent('#agent-instructions'), 'You are RESEARCH. Take your time.');
    assert.equal(await page.textContent('#agent-detail-version'), version.research);
    assert.deepEqual(JSON.parse(await page.textContent('#agent-settings')), {model: 'research-model', temperature: 0.9});

    // The start box offers the agents, "default" first chosen; the Run
    // started with the other shows it, and its version, on its page.
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#start-agent option[value=research]', {state: 'attached'});
    assert.equal(await page.inputValue('#start-agent'), 'default');
    await page.fill('#start-session', 'research');
    await page.selectOption('#start-agent', 'research');
    await page.fill('#start-input', 'run a slow job for 1 seconds');
    await page.click('#start-run');
    await page.waitForURL(/#\/runs\/run_/);
    const runID = decodeURIComponent(page.url().split('#/runs/')[1]);
    await page.waitForSelector('#run-agent-version');
    assert.equal(await page.textContent('#run-agent-name'), 'research');
    assert.equal(await page.textContent('#run-agent-version'), version.research);
    await waitStatus('completed');
    const run = (await api(demoToken, 'GET', '/v1/runs/' + runID)).body;
    assert.deepEqual([run.agent, run.agent_version], ['research', version.research]);
    await page.click('#run-agent-name');
    await page.waitForURL(/#\/agents\/research$/);
    await page.waitForSelector('#agent-instructions');

    // The list shows each Run's agent, and filters by agent through the
    // API; a list filtered by an agent starts its Runs with it.
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#runs-body tr[data-run="' + runID + '"] td.agent a:text-is("research")');
    await page.waitForSelector('#runs-body tr[data-run="' + demoRun + '"] td.agent a:text-is("default")');
    await page.waitForSelector('#agent-filter option[value=research]', {state: 'attached'});
    await page.selectOption('#agent-filter', 'research');
    await page.waitForURL(/agent=research/);
    await page.waitForSelector('#runs-body tr[data-run="' + runID + '"]');
    await page.waitForSelector('#runs-body tr[data-run="' + demoRun + '"]', {state: 'detached'});
    assert.deepEqual(await page.locator('#runs-body tr.run').evaluateAll(trs => [...new Set(trs.map(tr => tr.dataset.agent))]), ['research']);
    assert.ok(urls.some(u => /\/v1\/runs\?.*agent=research/.test(u)), 'the list asked the API for the agent\'s Runs');
    await page.waitForSelector('#start-agent option[value=research]', {state: 'attached'});
    assert.equal(await page.inputValue('#start-agent'), 'research');
    await page.selectOption('#status-filter', 'completed');
    await page.waitForURL(/status=completed&agent=research|agent=research.*status=completed/);
    await page.waitForSelector('#runs-body tr[data-run="' + runID + '"]');

    // An agent the tenant does not have (the config changed since the
    // page read them): the API's message names the ones it has.
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#start-agent option[value=research]', {state: 'attached'});
    await page.evaluate(() => {
      const s = document.getElementById('start-agent');
      s.append(new Option('gone', 'gone'));
      s.value = 'gone';
    });
    await page.fill('#start-input', 'hello');
    await page.click('#start-run');
    await page.waitForSelector('#banner.banner-error:not([hidden])');
    assert.match(await page.textContent('#banner'), /^Starting the Run failed: this tenant has no agent "gone" \(its agents: default, helper, lead, research, streamer\)/);
    await page.waitForSelector('#start-agent option[value=gone]', {state: 'detached'});
    assert.ok(page.url().endsWith('#/runs'), 'no Run was started: ' + page.url());
    await page.goto(base + '/console/#/agents/gone');
    await page.waitForSelector('#agent-not-found');
    assert.match(await page.textContent('#agent-not-found'), /no agent "gone" \(its agents: default, helper, lead, research, streamer\)/);
  });

  await step('approve-one-deny-the-other', async () => {
    await startRun('approvals', 'What is 2+3 and 4*5?');
    await page.waitForSelector('#actions .approval[data-tool-call-id=call_1_1]');
    await page.waitForSelector('#actions .approval[data-tool-call-id=call_1_2]');
    await page.click('#actions .approval[data-tool-call-id=call_1_1] button.approve');
    await page.waitForSelector('#actions .approval[data-tool-call-id=call_1_1]', {state: 'detached'});
    // The approved call runs: its result comes, and the Run waits again
    // for the other. The page sends each answer with If-Match, so the
    // next one waits for the page to have read the Run since.
    await page.waitForSelector('#conversation .call[data-tool-call-id=call_1_1] pre.result');
    await caughtUp();
    const deny = '#actions .approval[data-tool-call-id=call_1_2]';
    await page.fill(deny + ' input.reason', 'not this one');
    await page.click(deny + ' button.deny');
    await waitStatus('completed');
    const answer = await page.textContent('#final-answer');
    assert.match(answer, /2\+3 = 5/);
    assert.match(answer, /could not compute 4\*5 \(.*the call was denied: not this one\)/, 'the model was told of the denial: ' + answer);
    assert.match(await page.textContent('#conversation .call[data-tool-call-id=call_1_2]'), /denied: not this one/);
    assert.match(await page.textContent('#conversation .call[data-tool-call-id=call_1_1] pre.result'), /^5$/);
    if (process.env.CONSOLE_SCREENSHOT) await page.screenshot({path: process.env.CONSOLE_SCREENSHOT, fullPage: true});
  });

  // lead calls helper as a tool: each call is a child Run of helper, whose
  // calculate call waits for approval. The parent's page says so, with
  // the link to the child, where it is answered.
  const leadInput = (expr) => 'use helper {"input": "use calculate {\\"expression\\": \\"' + expr + '\\"}"}';
  async function startLead(session, expr) {
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#start-agent option[value=lead]', {state: 'attached'});
    await page.fill('#start-session', session);
    await page.selectOption('#start-agent', 'lead');
    await page.fill('#start-input', leadInput(expr));
    await page.click('#start-run');
    await page.waitForURL(/#\/runs\/run_/);
    await page.waitForSelector('#run-head h1');
    const parentID = decodeURIComponent(page.url().split('#/runs/')[1]);
    const wait = page.locator('#child-waits .child-wait');
    await wait.waitFor();
    return {parentID, childID: await wait.getAttribute('data-run'), wait};
  }

  await step('a-child-run-waits-and-is-answered-on-its-page', async () => {
    const {parentID, childID, wait} = await startLead('subagents', '6*7');
    assert.equal(await wait.textContent(), 'helper waits for your approval of calculate — open the child Run to answer (' + childID + ').');
    const parent = (await api(demoToken, 'GET', '/v1/runs/' + parentID)).body;
    assert.deepEqual(parent.children.map(c => [c.run, c.agent, c.tool_call_id]), [[childID, 'helper', 'call_1_1']]);
    // The parent lists the child, and its call links to it; the parent
    // itself has nothing to answer.
    await page.waitForSelector('#children-body tr.child[data-run="' + childID + '"][data-status=waiting] a:text-is("helper")');
    await page.waitForSelector('#conversation .call[data-tool-call-id=call_1_1] a.child-link:text-is("' + childID + '")');
    assert.equal(await page.locator('#actions .approval').count(), 0);
    await shot('a-parent-whose-child-waits');

    await page.click('#child-waits a.open-child');
    await page.waitForURL(new RegExp('#/runs/' + childID + '$'));
    await page.waitForSelector('#run-parent');
    assert.equal(await page.textContent('#run-parent'), 'Child of ' + parentID + ' (call call_1_1, depth 1)');
    assert.equal(await page.textContent('#run-agent-name'), 'helper');
    await page.waitForSelector('#actions .approval[data-tool-call-id=call_1_1]');
    await shot('the-child-waits-for-approval');
    await page.click('#actions .approval[data-tool-call-id=call_1_1] button.approve');
    await waitStatus('completed');
    assert.match(await page.textContent('#final-answer .text'), /6\*7 = 42/);

    // Back on the parent, through the child's link: it has the child's answer.
    await page.click('#run-parent-link');
    await page.waitForURL(new RegExp('#/runs/' + parentID + '$'));
    await waitStatus('completed');
    assert.match(await page.textContent('#final-answer .text'), /42/);
    await page.waitForSelector('#children-body tr.child[data-run="' + childID + '"][data-status=completed]');
    assert.ok(await page.locator('#child-waits').isHidden(), 'no child waits any more');

    // The Runs list marks the child with its parent.
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#runs-body tr[data-run="' + childID + '"][data-parent="' + parentID + '"] .child-of a.parent-link');
    assert.equal(await page.locator('#runs-body tr[data-run="' + parentID + '"] .child-of').count(), 0);
  });

  await step('cancelling-a-parent-cancels-its-child', async () => {
    const {parentID, childID} = await startLead('subagents-cancel', '1+1');
    await caughtUp();
    await page.fill('#cancel-reason', 'not needed');
    await page.click('#cancel-run');
    await waitStatus('cancelled');
    // The page reads the child until it has ended too.
    await page.waitForSelector('#children-body tr.child[data-run="' + childID + '"][data-status=cancelled]');
    await page.waitForSelector('#child-waits', {state: 'hidden'});
    const child = (await api(demoToken, 'GET', '/v1/runs/' + childID)).body;
    assert.deepEqual([child.status, child.parent.run], ['cancelled', parentID]);
  });

  // Agent streamer's model streams its answer: the page shows it growing,
  // in a block of its own, while the Run runs; the committed answer
  // replaces it when the model's call settles.
  await step('a-model-answer-grows-as-it-streams', async () => {
    const answer = process.env.STREAMED_ANSWER;
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#start-agent option[value=streamer]', {state: 'attached'});
    await page.fill('#start-session', 'streaming');
    await page.selectOption('#start-agent', 'streamer');
    await page.fill('#start-input', 'At what temperature does water boil up there?');
    await page.click('#start-run');
    await page.waitForURL(/#\/runs\/run_/);
    const runID = decodeURIComponent(page.url().split('#/runs/')[1]);
    // The deltas are not replayed: the model begins once the page's
    // stream is open.
    await page.waitForSelector('#connection.conn-live');
    console.log('STREAM');
    assert.equal(await readLine(), 'STREAMING');
    // The fake holds the answer after its first two pieces of 4 runes.
    const live = '#conversation .msg.model[data-step="1"] .live';
    await page.waitForFunction(([sel, want]) => {
      const t = document.querySelector(sel + ' .text');
      return t !== null && t.textContent === want;
    }, [live, answer.slice(0, 8)]);
    assert.equal(await page.getAttribute(live, 'data-attempt'), '1');
    assert.equal(await page.textContent(live + ' .who'), 'The model is answering…');
    assert.equal(await page.textContent('#conversation .msg.model[data-step="1"] > .who'), 'Model step 1 (answering…)');
    assert.equal(await page.locator('#final-answer').count(), 0);
    assert.equal((await api(demoToken, 'GET', '/v1/runs/' + runID)).body.status, 'running');
    await waitStatus('running');
    await shot('the-answer-as-it-streams');
    console.log('RELEASE');
    assert.equal(await readLine(), 'RELEASED');
    await waitStatus('completed');
    assert.equal(await page.textContent('#final-answer .text'), answer);
    await page.waitForSelector(live, {state: 'detached'});
    assert.equal(await page.textContent('#conversation .msg.model[data-step="1"] > .text'), answer);
    // The deltas have no id: the log holds every event once, in order.
    await checkLogWhole(demoToken, runID);
  });

  await step('a-stale-answer-gets-412', async () => {
    await signIn(acmeToken);
    const runID = await startRun('stale', 'ask:What is your name?|answer:nice to meet you');
    await page.waitForSelector('#question');
    // Hold the page's event stream, so that it does not see the Run move
    // on, and answer behind its back.
    await page.route('**/v1/runs/*/events', () => {});
    await page.reload();
    await page.waitForSelector('#question');
    const r = await api(acmeToken, 'POST', '/v1/runs/' + runID + '/input', {message: 'from elsewhere'});
    assert.equal(r.status, 200);
    await page.fill('#answer-text', 'too late');
    await page.click('#answer-send');
    await page.waitForSelector('#moved:not([hidden])');
    assert.match(await page.textContent('#moved'), /This Run has moved on/);
    // Refresh reads the Run again (the stream is still held: only the
    // button can show the page that the question was answered).
    await page.click('#moved button');
    await page.waitForSelector('#question', {state: 'detached'});
    await page.unroute('**/v1/runs/*/events');
  });

  await step('answer-a-question', async () => {
    await startRun('ask', 'ask:What is your name?|ask:And your quest?|answer:nice to meet you');
    await page.waitForSelector('#question .prompt:text-is("What is your name?")');
    await page.fill('#answer-text', 'Ada');
    await page.click('#answer-send');
    // The next question, another step's, takes the first one's place.
    await page.waitForSelector('#question .prompt:text-is("And your quest?")');
    await caughtUp();
    await page.fill('#answer-text', 'To compute');
    await page.click('#answer-send');
    await waitStatus('completed');
    assert.equal(await page.textContent('#final-answer .text'), 'nice to meet you');
    const said = await page.locator('#conversation .msg.user .text').allTextContents();
    assert.ok(said.includes('Ada') && said.includes('To compute'), 'the answers are in the conversation: ' + said);
  });

  await step('cancel-with-a-slow-job-in-flight', async () => {
    const runID = await startRun('cancel', 'call:slow_job({"seconds":300,"label":"long"})|answer:never');
    await page.waitForSelector('#event-log tr.ev[data-type=effect_pending]');
    await caughtUp();
    assert.match(await page.textContent('#inflight'), /slow_job/);
    await page.fill('#cancel-reason', 'changed my mind');
    await page.click('#cancel-run');
    await waitStatus('cancelled');
    assert.match(await page.textContent('#run-failure'), /cancelled/);
    await page.waitForSelector('#conversation .msg.note');
    assert.match(await page.textContent('#conversation'), /Cancel requested: changed my mind/);
    const run = (await api(acmeToken, 'GET', '/v1/runs/' + runID)).body;
    assert.equal(run.status, 'cancelled');
  });

  await step('untrusted-content-is-text', async () => {
    const payload = '<img src=x onerror=alert(1)><script>alert(2)</script>';
    await startRun('xss', 'call:echo({"text":"' + payload + '"})|answer:$results');
    await waitStatus('completed');
    assert.equal(await page.textContent('#conversation .call pre.result'), payload);
    assert.equal(await page.textContent('#final-answer .text'), payload);
    assert.equal(await page.locator('main img, main script').count(), 0, 'no element came from the payload');
    await page.goto(base + '/console/#/runs');
    await page.waitForSelector('#runs-body tr.run');
    assert.ok((await page.locator('#runs-body td.preview').allTextContents()).some(t => t.includes(payload)));
    assert.equal(await page.locator('main img, main script').count(), 0);
    assert.deepEqual(dialogs, [], 'no dialog opened');
  });

  await step('attempts-and-errors-show-their-class', async () => {
    await startRun('errors', 'call:fail({"why":"test"})|answer:$results');
    await waitStatus('completed');
    const row = page.locator('#attempts tr.has-error');
    await row.first().waitFor();
    assert.match(await row.first().textContent(), /tool failed on purpose/);
    assert.match(await row.first().locator('.class').textContent(), /^[a-z_]+$/, 'the error shows its class');
    assert.match(await page.textContent('#conversation .call[data-tool-call-id=call_1_1]'), /tool failed on purpose/);
  });

  await step('the-list-is-paged', async () => {
    await page.goto(base + '/console/#/runs?page=2');
    const rows = page.locator('#runs-body tr.run');
    const total = (await api(acmeToken, 'GET', '/v1/runs?limit=500')).body.runs.length;
    assert.ok(total >= 5, 'acme has ' + total + ' Runs');
    for (let want = 2; ; want += 2) {
      await page.waitForFunction(n => document.querySelectorAll('#runs-body tr.run').length === n, Math.min(want, total));
      if (want >= total) break;
      await page.click('#load-more:not([hidden])');
    }
    assert.equal(await rows.count(), total);
    await page.waitForSelector('#load-more[hidden]', {state: 'attached'});
    // Paged two at a time, newest first, the list is the API's newest-first listing.
    const newest = (await api(acmeToken, 'GET', '/v1/runs?limit=500&order=newest')).body.runs.map(x => x.id);
    assert.deepEqual(await rows.evaluateAll(trs => trs.map(tr => tr.dataset.run)), newest);
  });

  await step('another-tenants-run-is-not-found', async () => {
    await page.goto(base + '/console/#/runs/' + demoRun);
    await page.waitForSelector('#not-found');
    assert.match(await page.textContent('#not-found'), /not found/);
  });

  await step('a-malformed-run-link-says-so', async () => {
    await page.goto(base + '/console/#/runs/' + demoRun);
    await page.waitForSelector('#not-found');
    // A link cut short in the middle of a percent-encoded character, on
    // which decodeURIComponent throws: the view must leave the page it
    // was on and say what is wrong.
    await page.evaluate(() => { location.hash = '#/runs/%E0%A4%A'; });
    await page.waitForSelector('#invalid-link');
    assert.match(await page.textContent('#invalid-link'), /not a valid Run link/);
    assert.equal(await page.locator('#not-found').count(), 0, 'the page shown before is gone');
    await page.click('#invalid-link a[href="#/runs"]');
    await page.waitForSelector('#start-form');
  });

  await step('a-restart-mid-run-resumes-the-live-view', async () => {
    const runID = await startRun('restart', 'call:slow_job({"seconds":4,"label":"restart"})|answer:$results');
    await page.waitForSelector('#event-log tr.ev[data-type=effect_pending]');
    await page.waitForSelector('#connection.conn-live');
    const before = await eventSeqs();
    console.log('RESTART'); // the Go test SIGKILLs the server and starts it again
    assert.equal(await readLine(), 'RESTARTED');
    await waitStatus('completed');
    await page.waitForSelector('#connection.conn-ended');
    const reconnects = Number(await page.getAttribute('#connection', 'data-reconnects'));
    assert.ok(reconnects >= 1, 'the stream was opened again after the kill (reconnects: ' + reconnects + ')');
    const after = await eventSeqs();
    assert.deepEqual(after.slice(0, before.length), before, 'the events seen before the kill are kept');
    await checkLogWhole(acmeToken, runID);
    assert.match(await page.textContent('#final-answer'), /finished/);
  });

  assert.deepEqual(dialogs, [], 'no dialog opened');
  assert.deepEqual(urls.filter(u => u.includes(demoToken) || u.includes(acmeToken)), [], 'no URL carries a token');
  assert.ok(bearer > 20, 'the API calls carry the token as a bearer header (' + bearer + ')');
  assert.deepEqual(problems, [], 'no script error or CSP refusal on the page');
  console.log('PASS');
} catch (e) {
  console.log('FAIL: ' + (e && e.stack || e));
  process.exitCode = 1;
} finally {
  await browser.close();
  stdin.close();
}
