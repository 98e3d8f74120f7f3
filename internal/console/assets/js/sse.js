// sse.js: a Run's event stream (GET /v1/runs/{id}/events) read with
// fetch(), since EventSource cannot send an Authorization header and the
// token must not go in the URL. It parses Server-Sent Events itself,
// resumes after a disconnect with Last-Event-ID set to the last event it
// delivered, and delivers each event once, in order: an event whose id is
// not past the last one delivered is dropped (a resumed stream starts
// after Last-Event-ID, so that happens only if a server replays). The
// messages without an id, progress and model_delta (a model's answer as
// it streams in), are not durable: they are handed on as they come and
// leave the ids alone.

import {headers, ApiError, enc} from './api.js';

const TERMINAL = new Set(['run_completed', 'run_failed', 'run_cancelled']);

// EventStream follows one Run. on: {event(ev), progress(data),
// delta(data), state(s, detail)} where ev is {id, type, data}, delta's
// data is a model_delta's ({effect, plugin, attempt, seq, text,
// tool_calls}; on.delta is optional), and s is one of
// connecting, live, reconnecting, ended, error. opts: from (the id to
// resume after), base (the API's origin; '' for the page's own), and
// isTerminal (async: whether the Run has ended), asked when a stream ends
// without the Run's terminal event: a Run whose event log retention
// pruned has a stream with no events, and so does a Run whose stream
// ended as the server stopped, which one resumes.
export class EventStream {
  constructor(runID, on, {from = 0, base = '', isTerminal = async () => false} = {}) {
    this.runID = runID;
    this.on = on;
    this.base = base;
    this.isTerminal = isTerminal;
    this.pruned = false;     // the stream ended without the terminal event of a Run that has ended
    this.lastID = from;      // the id of the last event delivered
    this.reconnects = 0;     // how many times the stream was opened again
    this.retryMS = 2000;     // the server's "retry:" hint
    this.closed = false;
    this.ended = false;
    this.abort = null;
    this.loop();
  }

  close() {
    this.closed = true;
    if (this.abort) this.abort.abort();
  }

  async loop() {
    let failures = 0;
    while (!this.closed && !this.ended) {
      this.abort = new AbortController();
      this.on.state(this.reconnects === 0 && failures === 0 ? 'connecting' : 'reconnecting');
      try {
        await this.once(this.abort.signal, () => { failures = 0; });
      } catch (e) {
        if (this.closed) return;
        if (e instanceof ApiError && (e.status === 404 || e.status === 401 || e.status === 400)) {
          this.on.state('error', e);
          return;
        }
        failures++;
        this.on.state('reconnecting', e);
        const wait = e instanceof ApiError && e.retryAfter ? e.retryAfter * 1000
          : Math.min(this.retryMS, 250 * 2 ** Math.min(failures, 4));
        await sleep(wait);
      }
      if (!this.closed && !this.ended) this.reconnects++;
    }
    if (this.ended) this.on.state('ended');
  }

  // once reads the stream until it ends; it throws when it cannot open it.
  async once(signal, opened) {
    const h = headers({Accept: 'text/event-stream'});
    if (this.lastID > 0) h['Last-Event-ID'] = String(this.lastID);
    let resp;
    try {
      resp = await fetch(this.base + '/v1/runs/' + enc(this.runID) + '/events', {headers: h, signal, cache: 'no-store',
        credentials: 'omit', referrerPolicy: 'no-referrer'});
    } catch (e) {
      if (this.closed) return;
      throw e;
    }
    if (!resp.ok) {
      let body = {};
      try { body = (await resp.json()).error || {}; } catch { /* not JSON */ }
      throw new ApiError(resp.status, body.code, body.message, Number(resp.headers.get('Retry-After')) || 0);
    }
    opened();
    this.on.state('live');
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    const parser = new SSEParser(msg => this.dispatch(msg));
    try {
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        parser.push(value);
        if (this.ended) { reader.cancel().catch(() => {}); return; }
      }
    } catch (e) {
      if (this.closed) return;
      throw e; // the connection broke: resume from lastID
    }
    if (this.ended || this.closed) return;
    if (await this.isTerminal().catch(() => false)) {
      this.ended = this.pruned = true; // its log was pruned: nothing more comes
      return;
    }
    throw new Error('the event stream ended before the Run did');
  }

  dispatch(msg) {
    if (msg.retry) { this.retryMS = msg.retry; return; }
    if (msg.id === undefined) {
      if (msg.event === 'progress') this.on.progress(parseJSON(msg.data));
      else if (msg.event === 'model_delta' && this.on.delta) this.on.delta(parseJSON(msg.data));
      return;
    }
    const id = Number(msg.id);
    if (!Number.isSafeInteger(id) || id <= this.lastID) return; // seen already
    this.lastID = id;
    this.on.event({id, type: msg.event, data: parseJSON(msg.data)});
    if (TERMINAL.has(msg.event)) this.ended = true;
  }
}

function parseJSON(s) { try { return JSON.parse(s); } catch { return null; } }
function sleep(ms) { return new Promise(r => setTimeout(r, ms)); }

// SSEParser turns chunks of text into messages {id, event, data, retry},
// by the rules of the HTML standard's event-stream format.
export class SSEParser {
  constructor(emit) {
    this.emit = emit;
    this.buf = '';
    this.reset();
  }
  reset() { this.msg = {data: []}; }
  push(chunk) {
    this.buf += chunk;
    let i;
    while ((i = this.buf.search(/\r\n|\r|\n/)) >= 0) {
      const nl = this.buf[i] === '\r' && this.buf[i + 1] === '\n' ? 2 : 1;
      if (this.buf[i] === '\r' && i + 1 === this.buf.length) break; // a \r\n may be split
      const line = this.buf.slice(0, i);
      this.buf = this.buf.slice(i + nl);
      this.line(line);
    }
  }
  line(line) {
    if (line === '') {
      const m = this.msg;
      this.reset();
      if (m.data.length || m.event || m.id !== undefined) {
        this.emit({id: m.id, event: m.event || 'message', data: m.data.join('\n')});
      }
      return;
    }
    if (line.startsWith(':')) return; // a comment: the heartbeat
    const c = line.indexOf(':');
    const field = c < 0 ? line : line.slice(0, c);
    let value = c < 0 ? '' : line.slice(c + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'id': if (!value.includes('\0')) this.msg.id = value; break;
      case 'event': this.msg.event = value; break;
      case 'data': this.msg.data.push(value); break;
      case 'retry': if (/^\d+$/.test(value)) this.emit({retry: Number(value)}); break;
    }
  }
}
