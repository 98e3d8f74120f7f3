// runview.js: a Run's events folded into what its page shows: the
// conversation (the question, each model step with its tool calls, their
// arguments and results, the answers to questions, the final answer), the
// attempts and errors of each effect, and a timeline of the effects. It is
// pure: the page calls apply() with each event, in order, once, and
// delta() with each model_delta, the pieces of a model's answer as it
// streams in, which it shows until the committed reply replaces them.

// effectRef parses an effect ID: "<run>.m<step>" or "<run>.t<step>.<i>".
export function effectRef(id) {
  const parts = String(id || '').split('.');
  if (parts.length === 2 && /^m\d+$/.test(parts[1])) return {kind: 'model', step: Number(parts[1].slice(1)), index: -1};
  if (parts.length === 3 && /^t\d+$/.test(parts[1]) && /^\d+$/.test(parts[2])) {
    return {kind: 'tool', step: Number(parts[1].slice(1)), index: Number(parts[2])};
  }
  return null;
}

export class RunView {
  constructor() {
    this.items = [];          // the conversation, in order
    this.steps = new Map();   // step → its item
    this.effects = new Map(); // effect ID → {id, kind, step, index, tool, callID, args, attempts, approval, outcome}
    this.order = [];          // effect IDs, in the order first seen
    this.live = new Map();    // model effect ID → the answer it is forming, from its deltas (delta())
    this.startedAt = 0;
    this.endedAt = 0;
    this.count = 0;
  }

  effect(id) {
    let e = this.effects.get(id);
    if (!e) {
      const ref = effectRef(id) || {kind: '?', step: 0, index: -1};
      e = {id, ...ref, tool: '', callID: '', args: null, attempts: [], approval: null, outcome: null, deferredAt: 0};
      this.effects.set(id, e);
      this.order.push(id);
    }
    return e;
  }

  step(n) {
    let s = this.steps.get(n);
    if (!s) {
      s = {kind: 'step', step: n, plannedAt: 0, content: '', calls: [], question: '', settled: false, error: null};
      this.steps.set(n, s);
      this.items.push(s);
    }
    return s;
  }

  attempt(e, n, at) {
    let a = e.attempts.find(x => x.attempt === n);
    if (!a) {
      a = {attempt: n, dispatchedAt: at, pendingAt: 0, settledAt: 0, settled: false, state: 'executing', error: null};
      e.attempts.push(a);
    }
    return a;
  }

  apply(ev) {
    const d = ev.data || {};
    const at = d.at || 0;
    this.count++;
    if (!this.startedAt) this.startedAt = at;
    switch (ev.type) {
      case 'run_created':
        this.items.push({kind: 'user', text: (d.spec && d.spec.input) || '', at});
        break;
      case 'model_step_planned':
        this.step(d.step).plannedAt = at;
        this.unrunCalls(d.step - 1, d.request, at);
        break;
      case 'effect_dispatched': {
        const e = this.effect(d.effect);
        this.attempt(e, d.attempt || 1, at);
        // A new attempt starts its answer again.
        const l = this.live.get(d.effect);
        if (l && l.attempt < (d.attempt || 1)) this.live.delete(d.effect);
        break;
      }
      case 'effect_pending': {
        const e = this.effect(d.effect);
        const a = this.attempt(e, d.attempt || 1, at);
        a.pendingAt = at;
        a.state = 'pending';
        break;
      }
      case 'effect_deferred':
        this.effect(d.effect).deferredAt = at;
        break;
      case 'effect_settled':
        this.settled(d, at);
        break;
      case 'approval_recorded':
        for (const a of d.approvals || []) {
          for (const e of this.effects.values()) {
            if (e.callID === a.tool_call_id && !e.approval) {
              e.approval = {approved: !!a.approved, reason: a.reason || '', at};
              if (!a.approved) {
                e.outcome = {state: 'failed', error: {class: 'approval_denied',
                  message: 'the call was denied: ' + (a.reason || 'no reason given')}, at};
              }
            }
          }
        }
        break;
      case 'input_provided':
        this.items.push({kind: 'user', text: d.input || '', at, answer: true});
        break;
      case 'cancel_requested':
        this.items.push({kind: 'note', text: 'Cancel requested' + (d.reason ? ': ' + d.reason : ''), at});
        break;
      case 'timer_fired':
        break;
      case 'step_failed':
        this.items.push({kind: 'failure', status: 'step_failed', failure: d.failure || {}, at});
        break;
      case 'run_completed':
        this.items.push({kind: 'final', text: d.result || '', at});
        this.endedAt = at;
        this.live.clear();
        break;
      case 'run_failed':
      case 'run_cancelled':
        this.items.push({kind: 'failure', status: ev.type === 'run_failed' ? 'failed' : 'cancelled', failure: d.failure || {}, at});
        this.endedAt = at;
        this.live.clear();
        break;
    }
  }

  // delta folds a model_delta (d: {effect, plugin, attempt, seq, text,
  // tool_calls}) into the answer its model effect is forming: the text
  // pieces concatenated, and the tool calls (each by its index: the name
  // and ID of its first piece, its arguments' pieces concatenated). A
  // later attempt starts the answer again; a delta of an earlier attempt,
  // of an attempt that has settled, or of a Run that has ended is dropped.
  // A gap in seq (a delta the server dropped for a slow reader) is not
  // repaired: the committed reply, in effect_settled, replaces the whole.
  // It returns the answer it changed, or null.
  delta(d) {
    const ref = d && effectRef(d.effect);
    if (!ref || ref.kind !== 'model' || this.endedAt) return null;
    const attempt = Number.isSafeInteger(d.attempt) && d.attempt > 0 ? d.attempt : 1;
    const e = this.effects.get(d.effect);
    if (e && e.attempts.some(a => a.attempt > attempt || (a.attempt === attempt && a.settled))) return null;
    let l = this.live.get(d.effect);
    if (l && attempt < l.attempt) return null;
    if (!l || attempt > l.attempt) {
      l = {effect: d.effect, step: ref.step, plugin: d.plugin || '', attempt, seq: 0, text: '', calls: []};
      this.live.set(d.effect, l);
    }
    l.seq = Math.max(l.seq, Number(d.seq) || 0);
    l.text += typeof d.text === 'string' ? d.text : '';
    for (const c of Array.isArray(d.tool_calls) ? d.tool_calls : []) {
      if (!c || !Number.isSafeInteger(c.index)) continue;
      let call = l.calls.find(x => x.index === c.index);
      if (!call) {
        call = {index: c.index, id: '', name: '', arguments: ''};
        l.calls.push(call);
        l.calls.sort((a, b) => a.index - b.index);
      }
      if (c.id) call.id = String(c.id);
      if (c.name) call.name = String(c.name);
      if (typeof c.arguments === 'string') call.arguments += c.arguments;
    }
    return l;
  }

  // answering returns the answer step's model is forming as it streams
  // in, or null.
  answering(step) {
    for (const l of this.live.values()) if (l.step === step) return l;
    return null;
  }

  // unrunCalls finds, in a model request, the results of the calls the
  // host settled without running them (a tool the Run does not offer,
  // arguments that fail the tool's input_schema): the Loop writes no event
  // for those, only the tool message ("error (CLASS): …") that the next
  // step's request carries, after the assistant message that asked for
  // them (the last one), for the calls of step prev.
  unrunCalls(prev, request, at) {
    const msgs = (request && Array.isArray(request.messages)) ? request.messages : [];
    let from = 0;
    msgs.forEach((m, i) => { if (m && m.role === 'assistant') from = i + 1; });
    for (const m of msgs.slice(from)) {
      if (!m || m.role !== 'tool' || !m.tool_call_id) continue;
      for (const e of this.effects.values()) {
        if (e.step !== prev || e.kind !== 'tool' || e.callID !== m.tool_call_id || e.outcome || e.attempts.length) continue;
        const text = String(m.content || '');
        const parsed = /^error \(([a-z_]+)\): ([\s\S]*)$/.exec(text);
        e.outcome = parsed
          ? {state: 'failed', error: {class: parsed[1], message: parsed[2]}, at}
          : {state: 'done', tool: {content: text, is_error: !!m.is_error}, at};
      }
    }
  }

  settled(d, at) {
    const e = this.effect(d.effect);
    const o = d.outcome || {};
    const a = this.attempt(e, d.attempt || 1, at);
    a.settledAt = at;
    a.settled = true;
    a.state = o.state || 'settled';
    // The committed reply replaces what the deltas showed.
    this.live.delete(d.effect);
    a.error = o.error || null;
    e.outcome = {...o, at};
    if (e.kind === 'model') {
      const s = this.step(e.step);
      s.settled = o.state === 'done';
      s.error = o.state === 'done' ? null : (o.error || null);
      const m = o.model;
      if (m && m.message) {
        s.content = m.message.content || '';
        s.question = m.await_input ? (m.await_input.prompt || '') : '';
        s.calls = (m.message.tool_calls || []).map((c, i) => {
          const te = this.effect(e.id.replace(/\.m(\d+)$/, '.t$1.' + i));
          te.tool = c.name;
          te.callID = c.id;
          te.args = c.arguments;
          return te.id;
        });
      }
    }
  }

  // timeline lists the effects with their time span: from the first
  // dispatch to the last settlement (or now, for one still running). A
  // call that ended without running (a person denied it) is listed at the
  // time it ended, with notRun set and the class it ended with.
  timeline(now = Date.now()) {
    const rows = [];
    for (const id of this.order) {
      const e = this.effects.get(id);
      if (!e.attempts.length) {
        if (e.outcome && e.outcome.at) {
          rows.push({id, label: (e.tool || 'tool') + ' (' + (e.callID || id) + ')', kind: e.kind, start: e.outcome.at, end: e.outcome.at,
            running: false, duration: 0, attempts: 0, state: e.outcome.state, notRun: (e.outcome.error && e.outcome.error.class) || e.outcome.state});
        }
        continue;
      }
      const start = e.attempts[0].dispatchedAt;
      const last = e.attempts[e.attempts.length - 1];
      const end = last.settledAt || (e.outcome && e.outcome.at) || 0;
      rows.push({id, label: e.kind === 'model' ? 'model step ' + e.step : (e.tool || 'tool') + ' (' + (e.callID || id) + ')',
        kind: e.kind, start, end, running: !end, duration: (end || now) - start, attempts: e.attempts.length,
        state: end ? last.state : 'running'});
    }
    return rows;
  }
}
