// run.js: a Run's page: its state and actions, the conversation (with a
// model's answer growing as it streams in), the attempts and errors, a
// timeline of the effects, and the event log, live;
// for a child Run, the parent it answers; for a parent, its child Runs and
// which of them wait for a person.

import {el, replace, pretty, ago, duration, clock, badge, usage} from './dom.js';
import {api, ApiError, NetworkError} from './api.js';
import {EventStream} from './sse.js';
import {RunView} from './runview.js';
import {agentHash} from './route.js';
import {childrenShown, childStatus, childWait, childrenToRead, parentNote, ended, CHILDREN_SHOWN} from './children.js';

// CHILD_POLL_MS is how often a parent's page reads its child Runs that
// may still change, while the tab is visible: a child's approvals and
// questions are not in its parent's events (its parent's call is
// pending all along), so the page looks at the children themselves.
const CHILD_POLL_MS = 2000;

// runPage renders the Run into main and returns a function that stops
// its stream and timers.
export function runPage(main, runID, {notice}) {
  const view = new RunView();
  const parts = {
    head: el('section', {class: 'card', id: 'run-head'}),
    childWaits: el('section', {class: 'card child-waits', id: 'child-waits', hidden: true}),
    actions: el('section', {class: 'card', id: 'actions'}),
    children: el('section', {class: 'card', id: 'children', hidden: true}),
    conversation: el('section', {class: 'card', id: 'conversation'}),
    attempts: el('section', {class: 'card', id: 'attempts'}),
    timeline: el('section', {class: 'card', id: 'timeline'}),
    log: el('section', {class: 'card', id: 'event-log'}),
  };
  const logBody = el('tbody');
  const connection = el('span', {class: 'conn', id: 'connection', text: 'connecting'});
  replace(parts.log, el('h2', {}, 'Event log ', connection),
    el('table', {class: 'events'}, el('thead', {}, el('tr', {}, el('th', {text: 'seq'}), el('th', {text: 'time'}),
      el('th', {text: 'event'}), el('th', {text: 'detail'}))), logBody));
  replace(main, el('p', {class: 'crumbs'}, el('a', {href: '#/runs', text: 'Runs'}), ' / ', el('span', {class: 'mono', text: runID})),
    parts.childWaits,
    el('div', {class: 'run-grid'}, el('div', {class: 'col'}, parts.head, parts.actions, parts.children, parts.conversation),
      el('div', {class: 'col'}, parts.timeline, parts.attempts, parts.log)));

  let run = null;          // the Run as GET /v1/runs/{id} last gave it
  let actionsKey = '';     // what the actions panel shows, to keep its fields while it holds
  let stream = null;
  let stopped = false;
  let refreshing = null;
  let renderQueued = false;
  let liveQueued = false;
  let liveShown = new Map(); // model effect ID → the block the conversation shows its streaming answer in
  const childGot = new Map(); // child Run ID → what the page knows of it (children.js)
  let childrenKey = '';       // the children the conversation's calls were drawn with
  let childTimer = 0;

  const stop = () => {
    stopped = true;
    if (stream) stream.close();
    clearInterval(ticker);
    clearTimeout(childTimer);
  };

  function notFound() {
    stop();
    replace(main, el('section', {class: 'card notfound', id: 'not-found'},
      el('h1', {text: 'Run not found'}),
      el('p', {}, 'No Run ', el('code', {text: runID}), ' was found for this tenant: it does not exist, or belongs to another tenant.'),
      el('p', {}, el('a', {href: '#/runs', text: 'Back to the Runs'}))));
  }

  // refresh reads the Run again (after events, after an action, or when
  // the user asks). One read runs at a time; a call made while one runs
  // makes one more run after it, so that the last read starts after the
  // last call (a read that started before an event may not show it).
  let again = false;
  async function refresh() {
    if (refreshing) { again = true; return refreshing; }
    refreshing = (async () => {
      do {
        again = false;
        try {
          show(await api.run(runID));
        } catch (e) {
          if (e instanceof ApiError && e.notFound) { notFound(); return; }
          if (!(e instanceof NetworkError)) notice(e.message, 'error');
        }
      } while (again && !stopped);
    })().finally(() => { refreshing = null; });
    return refreshing;
  }

  // show takes a Run the API gave (a read, or an action's answer) unless
  // the page has a later version already: answers may arrive out of order.
  function show(r) {
    if (run && r.seq < run.seq) return;
    run = r;
    renderHead();
    renderActions();
    // A call of an agent tool links to its child once the Run lists it.
    const key = (run.children || []).map(c => c.run).join(' ');
    if (key !== childrenKey) { childrenKey = key; queueRender(); }
    if (run.children && run.children.length) {
      renderChildren();
      loadChildren();
    }
  }

  // loadChildren reads the shown child Runs that may still change, one
  // after the other (a tenant's concurrent reads are bounded), after the
  // parent's events and every CHILD_POLL_MS while one may change. Like
  // refresh, one pass runs at a time, and a call made during one makes
  // one more after it.
  let loadingChildren = null;
  let childrenAgain = false;
  function loadChildren() {
    if (loadingChildren) { childrenAgain = true; return loadingChildren; }
    clearTimeout(childTimer);
    loadingChildren = (async () => {
      do {
        childrenAgain = false;
        const shown = childrenShown(run.children);
        for (const id of childrenToRead(shown, childGot, ended(run))) {
          if (stopped) return;
          try {
            childGot.set(id, {run: await api.run(id)});
          } catch (e) {
            if (e instanceof ApiError && e.notFound) childGot.set(id, {missing: true});
            // A read refused for a limit, or a server restarting, keeps
            // what the page knew: the next pass reads it again.
            else if (!(e instanceof NetworkError) && e.status !== 429) childGot.set(id, {error: e.message});
          }
        }
        if (!stopped) renderChildren();
      } while (childrenAgain && !stopped);
    })().finally(() => {
      loadingChildren = null;
      if (stopped || !run) return;
      // Read again while a child may change (a new child comes with an
      // event of the parent's, which reads them again).
      if (childrenToRead(childrenShown(run.children), childGot, ended(run)).length) {
        childTimer = setTimeout(pollChildren, CHILD_POLL_MS);
      }
    });
    return loadingChildren;
  }
  function pollChildren() {
    if (document.visibilityState === 'hidden') { childTimer = setTimeout(pollChildren, CHILD_POLL_MS); return; }
    loadChildren();
  }

  // renderChildren lists the child Runs with their status, and says at
  // the top of the page which of them wait for a person, with the link
  // to the child where that is answered.
  function renderChildren() {
    const all = run.children || [];
    const shown = childrenShown(all);
    const waits = [];
    const rows = shown.map(c => {
      const got = childGot.get(c.run);
      const status = childStatus(got, ended(run));
      const wait = got && got.run ? childWait(c.agent, got.run) : '';
      const link = () => el('a', {class: 'mono', href: '#/runs/' + encodeURIComponent(c.run), text: c.run});
      if (wait) {
        waits.push(el('p', {class: 'child-wait', dataset: {run: c.run}},
          el('strong', {text: wait}), ' — ', el('a', {class: 'open-child', href: '#/runs/' + encodeURIComponent(c.run), text: 'open the child Run'}),
          ' to answer (', link(), ').'));
      }
      return el('tr', {class: 'child', dataset: {run: c.run, status, toolCallId: c.tool_call_id || ''}},
        el('td', {}, link()),
        el('td', {}, c.agent ? el('a', {href: agentHash(c.agent), text: c.agent}) : ''),
        el('td', {class: 'mono', text: (c.tool_call_id || '') + (c.attempt > 1 ? ' attempt ' + c.attempt : '')}),
        el('td', {}, status ? badge(status) : el('span', {class: 'muted', text: 'reading…'}),
          wait ? el('span', {class: 'note', text: ' waits for a person'}) : null,
          got && got.error ? el('span', {class: 'muted', text: ' (' + got.error + ')'}) : null));
    });
    replace(parts.children, el('h2', {text: 'Child Runs'}),
      el('p', {class: 'muted', text: 'The Runs this Run\'s calls of agent tools started, each in a session of its own' +
        (all.length > shown.length ? '; the last ' + CHILDREN_SHOWN + ' of ' + all.length + ' are shown.' : '.')}),
      el('table', {class: 'children'}, el('thead', {}, el('tr', {}, ['Run', 'agent', 'call', 'status'].map(h => el('th', {text: h})))),
        el('tbody', {id: 'children-body'}, rows)));
    parts.children.hidden = false;
    replace(parts.childWaits, waits);
    parts.childWaits.hidden = waits.length === 0;
  }

  function renderHead() {
    if (!run) return;
    replace(parts.head,
      el('h1', {}, 'Run ', el('span', {class: 'mono', text: run.id}), ' ', badge(run.status)),
      run.parent ? el('p', {class: 'parent-of', id: 'run-parent'}, 'Child of ',
        el('a', {class: 'mono', id: 'run-parent-link', href: '#/runs/' + encodeURIComponent(run.parent.run), text: run.parent.run}),
        ' ', parentNote(run.parent)) : null,
      el('dl', {class: 'facts'},
        el('dt', {text: 'session'}), el('dd', {}, el('a', {href: '#/sessions/' + encodeURIComponent(run.session), text: run.session})),
        // The agent's version is the one the Run was started with and
        // keeps; the agent's page shows it as new Runs get it now.
        el('dt', {text: 'agent'}), el('dd', {id: 'run-agent'},
          el('a', {id: 'run-agent-name', href: agentHash(run.agent), text: run.agent}), ' ',
          run.agent_version ? el('span', {class: 'mono', id: 'run-agent-version', text: run.agent_version})
            : el('span', {class: 'muted', id: 'run-agent-version', text: '(no version: started before agents were versioned)'})),
        el('dt', {text: 'created'}), el('dd', {text: run.created_at + ' (' + ago(run.created_at) + ')'}),
        el('dt', {text: 'updated'}), el('dd', {text: run.updated_at + ' (' + ago(run.updated_at) + ')'}),
        el('dt', {text: 'model steps'}), el('dd', {text: String(run.step)}),
        el('dt', {text: 'usage'}), el('dd', {text: usage(run.usage) + ' tokens'}),
        el('dt', {text: 'version'}), el('dd', {id: 'run-seq', text: String(run.seq)}),
        run.result ? [el('dt', {text: 'result'}), el('dd', {class: 'result', id: 'run-result', text: run.result.content})] : null,
        run.failure ? [el('dt', {text: 'failure'}), el('dd', {class: 'failure', id: 'run-failure'},
          el('span', {class: 'class', text: run.failure.class}), ' ', run.failure.message)] : null));
  }

  const inflight = el('p', {class: 'muted', id: 'inflight'});
  function renderActions() {
    if (!run) return;
    const w = run.waiting;
    // What is in flight changes without changing what can be answered:
    // it is updated in place, and the fields being typed in stay.
    const bits = [];
    if (w && w.pending.length) bits.push('In flight: ' + w.pending.map(p => p.tool || p.kind).join(', ') + '.');
    if (w && w.wake_at) bits.push('Next timer: ' + w.wake_at + '.');
    inflight.textContent = bits.join(' ');
    inflight.hidden = !inflight.textContent;
    const key = JSON.stringify([run.status, run.step, w && w.approvals.map(a => a.tool_call_id), w && w.input && w.input.prompt]);
    if (key === actionsKey) return;
    actionsKey = key;
    if (!w) {
      replace(parts.actions, el('h2', {text: 'Actions'}), el('p', {class: 'muted', text: 'This Run has ended: there is nothing to answer.'}));
      return;
    }
    const moved = el('div', {class: 'moved', id: 'moved', hidden: true},
      el('strong', {text: 'This Run has moved on'}), ' since this page read it: what you answered was not sent. ',
      el('button', {type: 'button', on: {click: () => { actionsKey = ''; moved.hidden = true; refresh(); }}, text: 'Refresh'}));
    const act = async (what, fn, button) => {
      button.disabled = true;
      try {
        const r = await fn();
        actionsKey = '';
        show(r);
        notice(what, 'ok');
      } catch (e) {
        button.disabled = false;
        if (e instanceof ApiError && e.moved) { moved.hidden = false; return; }
        notice(what + ' failed: ' + e.message, 'error');
      }
    };
    const blocks = [];
    for (const a of w.approvals) {
      const reason = el('input', {type: 'text', class: 'reason', placeholder: 'reason (optional)', 'aria-label': 'reason for ' + a.tool_call_id});
      const approve = el('button', {type: 'button', class: 'approve', text: 'Approve'});
      const deny = el('button', {type: 'button', class: 'deny', text: 'Deny'});
      approve.addEventListener('click', () => act('Approved ' + a.tool_call_id,
        () => api.decide(run, [{tool_call_id: a.tool_call_id, approved: true, reason: reason.value}]), approve));
      deny.addEventListener('click', () => act('Denied ' + a.tool_call_id,
        () => api.decide(run, [{tool_call_id: a.tool_call_id, approved: false, reason: reason.value}]), deny));
      blocks.push(el('div', {class: 'approval', dataset: {toolCallId: a.tool_call_id}},
        el('div', {}, el('strong', {text: a.tool || 'tool'}), ' ', el('code', {text: a.tool_call_id}), ' waits for your approval'),
        el('pre', {class: 'args', text: pretty(a.arguments)}),
        el('div', {class: 'row'}, reason, approve, deny)));
    }
    if (w.input) {
      const text = el('textarea', {id: 'answer-text', rows: 2, 'aria-label': 'your answer'});
      const send = el('button', {type: 'button', id: 'answer-send', text: 'Send answer'});
      send.addEventListener('click', () => act('Answer sent', () => api.answer(run, text.value), send));
      blocks.push(el('div', {class: 'question', id: 'question'},
        el('div', {}, el('strong', {text: 'The model asks: '}), el('span', {class: 'prompt', text: w.input.prompt})),
        text, el('div', {class: 'row'}, send)));
    }
    blocks.push(inflight);
    if (w.queued) blocks.push(el('p', {class: 'muted', text: 'Queued behind an earlier Run of its session.'}));
    const reason = el('input', {type: 'text', id: 'cancel-reason', placeholder: 'reason (optional)', 'aria-label': 'reason to cancel'});
    const cancel = el('button', {type: 'button', id: 'cancel-run', class: 'deny', text: 'Cancel Run'});
    cancel.addEventListener('click', () => act('Cancel sent', () => api.cancel(run, reason.value), cancel));
    blocks.push(el('div', {class: 'row cancel'}, reason, cancel));
    replace(parts.actions, el('h2', {text: 'Actions'}), moved, ...blocks);
  }

  function renderConversation() {
    liveShown = new Map();
    const out = [el('h2', {text: 'Conversation'})];
    for (const it of view.items) {
      switch (it.kind) {
        case 'user':
          out.push(el('div', {class: 'msg user'}, el('div', {class: 'who', text: it.answer ? 'Answer' : 'Question'}),
            el('div', {class: 'text', text: it.text})));
          break;
        case 'step': {
          const calls = it.calls.map(id => callCard(view.effects.get(id)));
          const live = it.settled ? null : view.answering(it.step);
          out.push(el('div', {class: 'msg model', dataset: {step: it.step}},
            el('div', {class: 'who', text: 'Model step ' + it.step + (it.settled || it.error ? '' : live ? ' (answering…)' : ' (thinking…)')}),
            it.content && !it.question ? el('div', {class: 'text', text: it.content}) : null,
            it.question ? el('div', {class: 'text ask'}, el('strong', {text: 'Asks: '}), it.question) : null,
            it.error ? el('div', {class: 'failure'}, el('span', {class: 'class', text: it.error.class}), ' ', it.error.message) : null,
            calls.length ? el('div', {class: 'calls'}, calls) : null,
            live ? liveBlock(live) : null));
          break;
        }
        case 'note':
          out.push(el('div', {class: 'msg note', text: it.text}));
          break;
        case 'final':
          out.push(el('div', {class: 'msg final', id: 'final-answer'}, el('div', {class: 'who', text: 'Final answer'}),
            el('div', {class: 'text', text: it.text})));
          break;
        case 'failure':
          out.push(el('div', {class: 'msg failure-msg'}, el('div', {class: 'who', text: 'Run ' + it.status}),
            el('div', {class: 'text'}, el('span', {class: 'class', text: it.failure.class || ''}), ' ', it.failure.message || '')));
          break;
      }
    }
    if (stream && stream.pruned) {
      out.push(el('p', {class: 'muted', id: 'pruned'}, 'This Run has ended, and its event log has been pruned (the operator\'s ' +
        'retention keeps the logs of ended Runs for a while): its result or failure is above; the rest of what it did is gone.'));
    }
    replace(parts.conversation, ...out);
  }

  // liveBlock shows the answer a model is forming as it streams in (the
  // model_delta events, folded by view.delta): its text so far and the
  // tool calls being formed, as text. It is updated in place as pieces
  // come (renderLive); the committed reply takes its place when the
  // effect settles.
  function liveBlock(l) {
    const b = {who: el('div', {class: 'who'}), text: el('div', {class: 'text'}), calls: el('div', {class: 'calls'})};
    b.root = el('div', {class: 'live', dataset: {effect: l.effect}}, b.who, b.text, b.calls);
    fillLive(b, l);
    liveShown.set(l.effect, b);
    return b.root;
  }
  function fillLive(b, l) {
    b.root.dataset.attempt = String(l.attempt);
    b.who.textContent = 'The model is answering…' + (l.attempt > 1 ? ' (attempt ' + l.attempt + ')' : '');
    b.text.textContent = l.text;
    replace(b.calls, l.calls.map(c => el('div', {class: 'call forming', dataset: {index: c.index}},
      el('div', {}, el('strong', {text: c.name || 'tool'}), ' ', el('code', {text: c.id}), ' ', el('span', {class: 'muted', text: 'being formed'})),
      el('pre', {class: 'args', text: c.arguments}))));
    b.calls.hidden = l.calls.length === 0;
  }

  // renderLive brings the streaming answers' blocks up to date, once a
  // frame however fast the pieces come; an answer the conversation does
  // not show yet (its first piece) has it drawn again.
  function renderLive() {
    liveQueued = false;
    if (stopped) return;
    for (const [id, l] of view.live) {
      const b = liveShown.get(id);
      if (!b || !b.root.isConnected) { queueRender(); return; }
      fillLive(b, l);
    }
  }
  const queueLive = () => {
    if (!liveQueued) { liveQueued = true; requestAnimationFrame(renderLive); }
  };

  function callCard(e) {
    const waiting = run && run.waiting && run.waiting.approvals.some(a => a.tool_call_id === e.callID);
    // A call of an agent tool: the child Runs its attempts started.
    const children = ((run && run.children) || []).filter(c => c.tool_call_id && c.tool_call_id === e.callID);
    let state = 'queued', result = null;
    if (e.outcome) {
      const o = e.outcome;
      if (o.state === 'done' && o.tool) {
        state = o.tool.is_error ? 'error' : 'done';
        result = el('pre', {class: 'result' + (o.tool.is_error ? ' is-error' : ''), text: o.tool.content});
      } else {
        state = o.state;
        result = el('div', {class: 'failure'}, el('span', {class: 'class', text: (o.error && o.error.class) || o.state}), ' ',
          (o.error && o.error.message) || '');
      }
    } else if (waiting) {
      state = 'awaiting approval';
    } else if (e.attempts.length) {
      state = e.attempts[e.attempts.length - 1].state;
    }
    return el('div', {class: 'call', dataset: {toolCallId: e.callID, effect: e.id}},
      el('div', {}, el('strong', {text: e.tool}), ' ', el('code', {text: e.callID}), ' ', el('span', {class: 'badge call-' + state.replace(/\W/g, '_'), text: state}),
        e.approval ? el('span', {class: 'approval-note', text: e.approval.approved ? ' approved' : ' denied' + (e.approval.reason ? ': ' + e.approval.reason : '')}) : null),
      children.map(c => el('div', {class: 'call-child'}, (children.length > 1 ? 'attempt ' + c.attempt + ': ' : '') + 'child Run ',
        el('a', {class: 'mono child-link', href: '#/runs/' + encodeURIComponent(c.run), text: c.run}))),
      el('div', {class: 'label', text: 'arguments'}), el('pre', {class: 'args', text: pretty(e.args)}),
      result ? [el('div', {class: 'label', text: 'result'}), result] : null);
  }

  function renderAttempts() {
    const rows = [];
    for (const id of view.order) {
      const e = view.effects.get(id);
      for (const a of e.attempts) {
        rows.push(el('tr', {class: a.error ? 'has-error' : ''},
          el('td', {class: 'mono', text: e.kind === 'model' ? 'model ' + e.step : (e.tool || 'tool') + ' ' + e.callID}),
          el('td', {text: String(a.attempt)}),
          el('td', {text: a.state}),
          el('td', {text: a.settledAt ? duration(a.settledAt - a.dispatchedAt) : ''}),
          el('td', {}, a.error ? [el('span', {class: 'class', text: a.error.class}), ' ', a.error.message] : '')));
      }
      if (e.deferredAt) rows.push(el('tr', {}, el('td', {class: 'mono', text: e.id}), el('td', {text: ''}),
        el('td', {text: 'deferred'}), el('td', {text: ''}), el('td', {text: 'its executor was unavailable at recovery'})));
    }
    replace(parts.attempts, el('h2', {text: 'Attempts and errors'}),
      rows.length ? el('table', {class: 'attempts'}, el('thead', {}, el('tr', {}, ['effect', 'attempt', 'state', 'took', 'error'].map(h => el('th', {text: h})))),
        el('tbody', {}, rows)) : el('p', {class: 'muted', text: 'No effect has been dispatched yet.'}));
  }

  function renderTimeline() {
    const rows = view.timeline();
    const t0 = view.startedAt;
    const t1 = Math.max(view.endedAt || Date.now(), ...rows.map(r => r.start + r.duration), t0 + 1);
    const span = t1 - t0;
    const list = rows.map(r => {
      const bar = el('div', {class: 'bar kind-' + r.kind + (r.running ? ' running' : '')});
      // CSSOM, not a style attribute: the CSP allows no inline styles.
      bar.style.marginLeft = (100 * (r.start - t0) / span).toFixed(2) + '%';
      bar.style.width = Math.max(0.5, 100 * r.duration / span).toFixed(2) + '%';
      return el('div', {class: 'tl-row'}, el('div', {class: 'tl-label', text: r.label}),
        el('div', {class: 'tl-track'}, bar),
        el('div', {class: 'tl-at', text: '+' + duration(r.start - t0)}),
        el('div', {class: 'tl-dur', text: r.notRun ? 'not run (' + r.notRun + ')' : (r.running ? 'running ' : '') + duration(r.duration) + (r.attempts > 1 ? ' (' + r.attempts + ' attempts)' : '')}));
    });
    replace(parts.timeline, el('h2', {text: 'Timeline of effects'}),
      list.length ? el('div', {class: 'tl-row tl-head'}, el('div', {text: 'effect'}), el('div', {text: 'from the Run\'s start to ' + (view.endedAt ? 'its end' : 'now')}),
        el('div', {text: 'started'}), el('div', {text: 'took'})) : null,
      list.length ? list : el('p', {class: 'muted', text: 'No effect yet.'}));
  }

  function renderAll() {
    renderQueued = false;
    if (stopped) return;
    renderConversation();
    renderAttempts();
    renderTimeline();
  }
  const queueRender = () => {
    if (!renderQueued) { renderQueued = true; requestAnimationFrame(renderAll); }
  };

  function logRow(ev) {
    const d = ev.data || {};
    let detail = '';
    // An effect ID is "<run>.m1" or "<run>.t1.0": the run's ID is the page's.
    if (d.effect) detail = String(d.effect).replace(runID + '.', '') + (d.attempt ? ' attempt ' + d.attempt : '');
    if (d.spec) detail = 'session ' + (d.spec.session || '');
    if (d.outcome) detail += ' ' + d.outcome.state + (d.outcome.error ? ' ' + d.outcome.error.class : '');
    if (d.step) detail += ' step ' + d.step;
    if (d.approvals) detail += d.approvals.map(a => ' ' + a.tool_call_id + (a.approved ? ' approved' : ' denied')).join('');
    if (d.failure) detail += ' ' + d.failure.class;
    const raw = el('details', {}, el('summary', {text: detail.trim() || 'details'}), el('pre', {text: pretty(d)}));
    logBody.append(el('tr', {class: 'ev', dataset: {seq: ev.id, type: ev.type}},
      el('td', {class: 'mono', text: String(ev.id)}), el('td', {class: 'mono', text: clock(d.at)}),
      el('td', {text: ev.type}), el('td', {}, raw)));
  }

  let refreshTimer = 0;
  stream = new EventStream(runID, {
    event(ev) {
      view.apply(ev);
      logRow(ev);
      queueRender();
      // The Run's state (what it waits for, its version) follows its
      // events: read it again once a burst of them is in.
      clearTimeout(refreshTimer);
      refreshTimer = setTimeout(refresh, 100);
    },
    progress(data) {
      if (data) connection.title = 'progress: ' + (data.message || data.type || '');
    },
    // A piece of a model's answer as it streams in: not an event of the
    // log (it has no id, and the committed reply is the answer).
    delta(data) {
      if (view.delta(data)) queueLive();
    },
    state(s, err) {
      if (s === 'ended') queueRender();
      connection.textContent = s === 'reconnecting' ? 'reconnecting…' : s;
      connection.className = 'conn conn-' + s;
      connection.dataset.reconnects = String(stream ? stream.reconnects : 0);
      if (s === 'error' && err instanceof ApiError && err.notFound) notFound();
      if (s === 'live' && stream && stream.reconnects > 0) refresh();
    },
  }, {isTerminal: async () => { await refresh(); return !!(run && !run.waiting); }});
  // Running effects' bars and durations grow: draw them again each second
  // until the Run ends.
  // (Only the timeline: the conversation is drawn again on events only,
  // so that text being selected or read stays put.)
  const ticker = setInterval(() => { if (!stopped && !view.endedAt && !(stream && stream.ended)) renderTimeline(); }, 1000);
  refresh().then(queueRender);
  return stop;
}
