// dom.js: building the page from data. Everything shown comes from the
// API, and what the API holds comes from tenants, models and tools: it is
// untrusted. It is put on the page only as text (textContent, attribute
// values through setAttribute), never parsed as HTML: no file of the
// console sets an element's HTML (console_test.go checks it).

// el makes an element: el('a', {href: '#/runs', class: 'x'}, 'text', child…).
// props: class, text, title, dataset (an object), on (event → handler),
// and any other key as an attribute. Children are nodes or strings
// (strings become text nodes).
export function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = String(v);
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k === 'on') for (const [ev, fn] of Object.entries(v)) e.addEventListener(ev, fn);
    else if (k === 'href' && !safeHref(v)) throw new Error('console: refusing the link ' + v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  append(e, children);
  return e;
}

function append(e, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

// Links the console makes are its own routes only.
function safeHref(v) { return typeof v === 'string' && v.startsWith('#/'); }

// replace empties node and puts the children in.
export function replace(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

// pretty shows JSON (a value or raw text) indented, as text.
export function pretty(v) {
  if (v === undefined || v === null) return '';
  if (typeof v === 'string') {
    try { return JSON.stringify(JSON.parse(v), null, 2); } catch { return v; }
  }
  return JSON.stringify(v, null, 2);
}

// ago says how long ago an RFC 3339 time or Unix milliseconds was.
export function ago(t, now = Date.now()) {
  const ms = typeof t === 'number' ? t : Date.parse(t);
  if (!Number.isFinite(ms)) return '';
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return s + 's ago';
  if (s < 3600) return Math.floor(s / 60) + 'm ago';
  if (s < 86400) return Math.floor(s / 3600) + 'h ago';
  return Math.floor(s / 86400) + 'd ago';
}

// duration renders milliseconds: 850 ms, 2.4 s, 3m 05s.
export function duration(ms) {
  if (!Number.isFinite(ms) || ms < 0) return '';
  if (ms < 1000) return Math.round(ms) + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
  const m = Math.floor(ms / 60000), s = Math.round((ms % 60000) / 1000);
  return m + 'm ' + String(s).padStart(2, '0') + 's';
}

// clock renders Unix milliseconds as a UTC time of day with milliseconds.
export function clock(ms) {
  if (!Number.isFinite(ms)) return '';
  return new Date(ms).toISOString().slice(11, 23);
}

export function badge(status) {
  return el('span', {class: 'badge status-' + String(status).replace(/[^a-z_]/g, ''), text: status});
}

// usage renders a Run's usage.
export function usage(u) {
  if (!u) return '';
  return (u.input_tokens || 0) + ' in / ' + (u.output_tokens || 0) + ' out';
}
