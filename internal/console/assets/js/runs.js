// runs.js: the list of the tenant's Runs (or of one session's), with its
// status and agent filters, its pages, live updates and the box that
// starts a Run with a chosen agent.

import {el, replace, ago, badge, usage} from './dom.js';
import {api, ApiError, NetworkError} from './api.js';
import {listHash, agentHash} from './route.js';
import {chooseAgent} from './agents.js';

const STATUSES = ['', 'pending', 'running', 'waiting', 'completed', 'failed', 'cancelled'];
const PAGE = 50; // Runs a page of the list adds, unless the route says (?page=N)
const POLL_MS = 2000;
// Filtered by agent, a page of the API may hold few of the Runs it read,
// or none (the store has no index by agent, GET /v1/runs filters the Runs
// it loads): the list then reads pages of the most Runs the API gives, at
// most REQUESTS_PER_PAGE of them for each page it shows, so that a poll
// of a tenant with many Runs stays within a few requests; Load more
// reads further.
const REQUESTS_PER_PAGE = 8;

// runsPage renders the list into main: every Run of the tenant, or, with
// session set, that session's. It returns a function that stops it.
export function runsPage(main, {session = '', status = '', agent = '', page = PAGE, notice, go}) {
  let shown = page;     // how many Runs the list holds (Load more adds a page)
  const listPath = session ? '#/sessions/' + encodeURIComponent(session) : '#/runs';
  const size = page === PAGE ? undefined : page;
  let stopped = false;
  let timer = 0;
  const body = el('tbody', {id: 'runs-body'});
  const more = el('button', {type: 'button', id: 'load-more', hidden: true, text: 'Load more'});
  const state = el('p', {class: 'muted', id: 'runs-state', text: 'Loading…'});
  const sessions = el('tbody', {id: 'sessions-body'});
  const sessionsCard = el('section', {class: 'card', id: 'sessions', hidden: !!session},
    el('h2', {text: 'Sessions'}),
    el('p', {class: 'muted', text: 'The sessions of the Runs listed above, the one most recently updated first.'}),
    el('table', {class: 'sessions'}, el('thead', {}, el('tr', {}, ['session', 'Runs', 'latest', 'status', 'updated'].map(h => el('th', {text: h})))), sessions));
  const filter = el('select', {id: 'status-filter', 'aria-label': 'status'},
    STATUSES.map(s => el('option', {value: s, text: s || 'every status', selected: s === status})));
  filter.addEventListener('change', () => go(listHash(listPath, {status: filter.value, agent, size})));
  // The agent filter holds the tenant's agents once they are read, and
  // the one the route names even when the tenant no longer has it (its
  // old Runs are still listed).
  const agentFilter = el('select', {id: 'agent-filter', 'aria-label': 'agent'},
    el('option', {value: '', text: 'every agent', selected: !agent}),
    agent ? el('option', {value: agent, text: agent, selected: true}) : null);
  agentFilter.addEventListener('change', () => go(listHash(listPath, {status, agent: agentFilter.value, size})));

  const sessionInput = el('input', {type: 'text', id: 'start-session', value: session || 'console', 'aria-label': 'session',
    pattern: '[A-Za-z0-9_\\-]{1,64}', required: true});
  const input = el('textarea', {id: 'start-input', rows: 3, placeholder: 'What is (2+3)*4?', 'aria-label': 'input', required: true});
  // The agent a Run is started with: the tenant's agents once read
  // (until then, and if they cannot be read, the submission names none,
  // and the API runs it as "default").
  const startAgent = el('select', {id: 'start-agent', 'aria-label': 'agent'});
  const start = el('button', {type: 'submit', id: 'start-run', text: 'Start Run'});
  const form = el('form', {class: 'start', id: 'start-form'}, el('h2', {text: 'Start a Run'}),
    el('label', {}, 'Session ', sessionInput), el('label', {}, 'Agent ', startAgent), el('label', {class: 'grow'}, 'Input ', input), start);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    start.disabled = true;
    try {
      const run = await api.submit(sessionInput.value.trim(), input.value, startAgent.value);
      go('#/runs/' + encodeURIComponent(run.id));
    } catch (e) {
      start.disabled = false;
      // agent_not_found's message names the agents the tenant has: the
      // config changed since the page read them, so read them again.
      if (e instanceof ApiError && e.code === 'agent_not_found') loadAgents();
      notice('Starting the Run failed: ' + e.message, 'error');
    }
  });

  async function loadAgents() {
    let names;
    try {
      names = (await api.agents()).agents.map(a => a.name);
    } catch (e) {
      if (stopped) return;
      if (!(e instanceof NetworkError)) notice('Could not read the agents: ' + e.message, 'error');
      return;
    }
    if (stopped) return;
    const chosen = names.includes(startAgent.value) ? startAgent.value : chooseAgent(names, agent);
    startAgent.replaceChildren(...names.map(n => el('option', {value: n, text: n, selected: n === chosen})));
    const filters = agent && !names.includes(agent) ? [...names, agent] : names;
    agentFilter.replaceChildren(el('option', {value: '', text: 'every agent', selected: !agent}),
      ...filters.map(n => el('option', {value: n, text: n, selected: n === agent})));
  }

  replace(main,
    el('p', {class: 'crumbs'}, session ? [el('a', {href: '#/runs', text: 'Runs'}), ' / session ', el('span', {class: 'mono', text: session})] : 'Runs'),
    el('section', {class: 'card'}, form),
    el('section', {class: 'card'},
      el('div', {class: 'row'}, el('h2', {text: session ? 'Runs of session ' + session : 'Runs'}),
        el('label', {}, 'Agent ', agentFilter), el('label', {}, 'Status ', filter)),
      el('table', {class: 'runs'}, el('thead', {}, el('tr', {}, ['Run', session ? '#' : 'session', 'agent', 'status', 'input', 'steps', 'usage', 'age', 'updated']
        .map(h => el('th', {text: h})))), body),
      state, more),
    sessionsCard);

  more.addEventListener('click', () => { shown += page; load(); });

  // load reads the first `shown` Runs again: the list is live by reading
  // it every POLL_MS while the tab is visible.
  async function load() {
    clearTimeout(timer);
    if (stopped) return;
    try {
      const rows = [];
      let after = '', next = null, left = shown;
      const byAgent = agent && !session;
      let requests = REQUESTS_PER_PAGE * Math.ceil(shown / page);
      do {
        const q = {limit: String(byAgent ? 500 : Math.min(left, 500))};
        if (after) q.after = after;
        // The tenant's Runs newest first (next_after then goes on back in
        // time); a session's in their order in it, the only one its list has.
        if (!session) q.order = 'newest';
        if (status && !session) q.status = status;
        if (byAgent) q.agent = agent;
        const got = session ? await api.sessionRuns(session, q) : await api.runs(q);
        if (stopped) return;
        let runs = got.runs;
        // A session's Runs are filtered here: its list takes no filter.
        if (session && status) runs = runs.filter(r => r.status === status);
        if (session && agent) runs = runs.filter(r => r.agent === agent);
        rows.push(...runs);
        next = got.next_after;
        after = next === undefined || next === null ? '' : String(next);
        left -= got.runs.length;
        if (byAgent) requests--;
      } while (after && left > 0 && requests > 0);
      render(rows.slice(0, shown), !!after || rows.length > shown);
    } catch (e) {
      if (stopped) return;
      if (e instanceof ApiError && e.status === 404 && session) render([], false);
      else state.textContent = e instanceof NetworkError ? 'The server does not answer; retrying…' : 'Could not read the Runs: ' + e.message;
    }
    if (!stopped) timer = setTimeout(tick, POLL_MS);
  }
  function tick() {
    if (document.visibilityState === 'hidden') { timer = setTimeout(tick, POLL_MS); return; }
    load();
  }

  function render(rows, hasMore) {
    body.replaceChildren(...rows.map(r => el('tr', {class: 'run', dataset: r.parent_run ? {run: r.id, status: r.status, agent: r.agent, parent: r.parent_run}
      : {run: r.id, status: r.status, agent: r.agent}},
      el('td', {}, el('a', {class: 'mono', href: '#/runs/' + encodeURIComponent(r.id), text: r.id}),
        // A child Run (an agent's call of another agent) links to its parent.
        r.parent_run ? el('div', {class: 'child-of'}, 'child of ',
          el('a', {class: 'mono parent-link', href: '#/runs/' + encodeURIComponent(r.parent_run), text: r.parent_run})) : null),
      el('td', {}, session ? String(r.ordinal) : el('a', {href: '#/sessions/' + encodeURIComponent(r.session), text: r.session})),
      el('td', {class: 'agent'}, r.agent ? el('a', {href: agentHash(r.agent), text: r.agent}) : ''),
      el('td', {}, badge(r.status), waitingNote(r)),
      el('td', {class: 'preview', text: r.input_preview}),
      el('td', {text: String(r.step)}),
      el('td', {text: usage(r.usage)}),
      el('td', {title: r.created_at, text: ago(r.created_at)}),
      el('td', {title: r.updated_at, text: ago(r.updated_at)}))));
    more.hidden = !hasMore;
    if (!session) renderSessions(rows);
    state.textContent = rows.length ? rows.length + ' Run' + (rows.length === 1 ? '' : 's') + (session ? ', oldest first' : ', newest first') + '; updated live'
      : (session && !status && !agent ? 'This session has no Runs yet.'
        : 'No Runs' + (status ? ' ' + status : '') + (agent ? ' of agent ' + agent : '') + ' yet: start one above.');
  }

  // renderSessions groups the listed Runs by session: the API lists Runs,
  // and a session is the Runs that share its ID.
  function renderSessions(rows) {
    const by = new Map();
    for (const r of rows) {
      const s = by.get(r.session) || {id: r.session, n: 0, latest: r};
      s.n++;
      if (r.created_at >= s.latest.created_at) s.latest = r;
      by.set(r.session, s);
    }
    const list = [...by.values()].sort((a, b) => (a.latest.updated_at < b.latest.updated_at ? 1 : -1));
    sessions.replaceChildren(...list.map(s => el('tr', {dataset: {session: s.id}},
      el('td', {}, el('a', {href: '#/sessions/' + encodeURIComponent(s.id), text: s.id})),
      el('td', {text: String(s.n)}),
      el('td', {}, el('a', {class: 'mono', href: '#/runs/' + encodeURIComponent(s.latest.id), text: s.latest.id})),
      el('td', {}, badge(s.latest.status)),
      el('td', {title: s.latest.updated_at, text: ago(s.latest.updated_at)}))));
    sessionsCard.hidden = list.length === 0;
  }

  loadAgents();
  load();
  return () => { stopped = true; clearTimeout(timer); };
}

function waitingNote(r) {
  const w = r.waiting_summary;
  if (!w) return r.failure_class && r.failure_class !== r.status ? [' ', el('span', {class: 'class', text: r.failure_class})] : null;
  const bits = [];
  if (w.approvals) bits.push(w.approvals + ' approval' + (w.approvals === 1 ? '' : 's'));
  if (w.input) bits.push('a question');
  if (w.queued) bits.push('queued');
  return bits.length ? el('span', {class: 'note', text: ' waits for ' + bits.join(', ')}) : null;
}
