// api.js: the HTTP API, as the signed-in tenant. The token is kept in
// sessionStorage (this browser tab only, gone when it closes), sent in the
// Authorization header only: never in a URL, never in a log.

const TOKEN_KEY = 'agenthost.token';

export function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }
export function setToken(t) { sessionStorage.setItem(TOKEN_KEY, t); }
export function clearToken() { sessionStorage.removeItem(TOKEN_KEY); }

// ApiError is an answer that is not 2xx: its status, and the API's error
// code and message ({"error": {"code", "message"}}).
export class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message || ('HTTP ' + status));
    this.status = status;
    this.code = code || '';
    this.retryAfter = retryAfter || 0;
  }
  get notFound() { return this.status === 404; }
  get moved() { return this.status === 412; }
}

// NetworkError: the server could not be reached.
export class NetworkError extends Error {}

let onUnauthorized = () => {};
export function whenUnauthorized(fn) { onUnauthorized = fn; }

export function headers(extra = {}) {
  const h = {Accept: 'application/json', ...extra};
  const t = token();
  if (t) h.Authorization = 'Bearer ' + t;
  return h;
}

// request sends a request and returns {status, body, etag}, or throws an
// ApiError or a NetworkError. opts: body (sent as JSON), ifMatch (a Run's
// seq), key (an Idempotency-Key), signal, tokenOverride (sign-in's check).
export async function request(method, path, opts = {}) {
  const extra = {};
  if (opts.body !== undefined) extra['Content-Type'] = 'application/json';
  if (opts.ifMatch !== undefined) extra['If-Match'] = '"' + opts.ifMatch + '"';
  if (opts.key) extra['Idempotency-Key'] = opts.key;
  const h = headers(extra);
  if (opts.tokenOverride !== undefined) h.Authorization = 'Bearer ' + opts.tokenOverride;
  let resp;
  try {
    resp = await fetch(path, {method, headers: h, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body), signal: opts.signal});
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new NetworkError('the server did not answer (' + e.message + '); it may be restarting');
  }
  let body = null;
  const text = await resp.text().catch(() => '');
  if (text) { try { body = JSON.parse(text); } catch { body = null; } }
  if (!resp.ok) {
    const err = (body && body.error) || {};
    const e = new ApiError(resp.status, err.code, err.message, Number(resp.headers.get('Retry-After')) || 0);
    if (resp.status === 401 && opts.tokenOverride === undefined) onUnauthorized(e);
    throw e;
  }
  return {status: resp.status, body, etag: resp.headers.get('ETag')};
}

export const get = (path, opts) => request('GET', path, opts).then(r => r.body);

// idempotencyKey is a fresh random key (crypto.randomUUID needs a secure
// context; the console may be served over plain HTTP on a trusted network).
function idempotencyKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return 'console-' + Array.from(b, x => x.toString(16).padStart(2, '0')).join('');
}

export function enc(s) { return encodeURIComponent(s); }

// The API's calls the console makes.
export const api = {
  runs: (q) => get('/v1/runs?' + new URLSearchParams(q)),
  sessionRuns: (session, q) => get('/v1/sessions/' + enc(session) + '/runs?' + new URLSearchParams(q)),
  run: (id) => get('/v1/runs/' + enc(id)),
  // submit starts a Run; agent '' leaves it out (the agent "default").
  submit: (session, input, agent = '') => request('POST', '/v1/sessions/' + enc(session) + '/runs',
    {body: agent ? {input, agent} : {input}, key: idempotencyKey()}).then(r => r.body),
  agents: () => get('/v1/agents'),
  agent: (name) => get('/v1/agents/' + enc(name)),
  decide: (run, decisions) => request('POST', '/v1/runs/' + enc(run.id) + '/input',
    {body: {approvals: decisions}, ifMatch: run.seq}).then(r => r.body),
  answer: (run, message) => request('POST', '/v1/runs/' + enc(run.id) + '/input',
    {body: {message}, ifMatch: run.seq}).then(r => r.body),
  cancel: (run, reason) => request('POST', '/v1/runs/' + enc(run.id) + '/cancel',
    {body: reason ? {reason} : {}, ifMatch: run.seq}).then(r => r.body),
};
