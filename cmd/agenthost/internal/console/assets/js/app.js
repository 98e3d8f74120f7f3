// app.js: the console's routes (in the URL's fragment, so the server
// serves one page) and its sign-in. Routes:
//   #/signin              the token form
//   #/runs[?status=S][&page=N]  the tenant's Runs (N a page, default 50)
//   #/sessions/ID         one session's Runs
//   #/runs/ID             one Run

import {el, replace} from './dom.js';
import {token, setToken, clearToken, whenUnauthorized, request, get, ApiError} from './api.js';
import {runsPage} from './runs.js';
import {runPage} from './run.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const banner = document.getElementById('banner');
const tenantLabel = document.getElementById('tenant');
let stopPage = () => {};
let bannerTimer = 0;
let afterSignin = ''; // the page asked for before signing in

function notice(text, kind = 'ok') {
  banner.textContent = text;
  banner.className = 'banner banner-' + kind;
  banner.hidden = false;
  clearTimeout(bannerTimer);
  bannerTimer = setTimeout(() => { banner.hidden = true; }, kind === 'error' ? 10000 : 4000);
}

function go(hash, status) {
  const to = status ? hash + '?status=' + encodeURIComponent(status) : hash;
  if (location.hash === to) route(); // no hashchange comes
  else location.hash = to;
}

whenUnauthorized(() => {
  clearToken();
  notice('The token is no longer accepted: sign in again.', 'error');
  go('#/signin');
});

document.getElementById('signout').addEventListener('click', () => {
  clearToken();
  go('#/signin');
});

function signinPage() {
  const input = el('input', {type: 'password', id: 'token', autocomplete: 'off', required: true, 'aria-label': 'token'});
  const error = el('p', {class: 'error', id: 'signin-error', hidden: true});
  const button = el('button', {type: 'submit', id: 'signin-button', text: 'Sign in'});
  const form = el('form', {class: 'card signin', id: 'signin-form'},
    el('h1', {text: 'Sign in'}),
    el('p', {text: 'Sign in with a tenant\'s API token. The console sees only that tenant\'s Runs. ' +
      'The token is kept in this browser tab only, until you sign out or close it.'}),
    el('label', {}, 'Token ', input), button, error);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    error.hidden = true;
    const t = input.value.trim();
    try {
      await request('GET', '/v1/whoami', {tokenOverride: t});
      setToken(t);
      input.value = '';
      const to = afterSignin || '#/runs';
      afterSignin = '';
      go(to);
    } catch (e) {
      error.textContent = e instanceof ApiError && e.status === 401
        ? 'That token is not accepted: check it, or ask the operator for one (tenants.ID.tokens_sha256).'
        : 'Could not sign in: ' + e.message;
      error.hidden = false;
      button.disabled = false;
    }
  });
  replace(main, form);
  input.focus();
  return () => {};
}

// showTenant says in the header whom the token acts as (GET /v1/whoami).
let shownFor = null; // the token whose tenant the header shows
async function showTenant() {
  const t = token();
  if (shownFor === t) return;
  shownFor = t;
  tenantLabel.textContent = '';
  try {
    const who = await get('/v1/whoami');
    if (shownFor === t) tenantLabel.textContent = 'tenant ' + who.tenant;
  } catch {
    shownFor = null;
  }
}

function route() {
  stopPage();
  banner.hidden = true;
  const hash = location.hash || '#/runs';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const status = params.get('status') || '';
  // ?page=N sets how many Runs a page of the list adds (1 to 500).
  const n = Number(params.get('page'));
  const page = Number.isInteger(n) && n >= 1 && n <= 500 ? n : undefined;
  nav.hidden = !token();
  if (!token() || path === '/signin') {
    if (token() && path === '/signin') { stopPage = runsPage(main, {status, notice, go}); return; }
    if (!token() && path !== '/signin') afterSignin = hash;
    stopPage = signinPage();
    return;
  }
  showTenant();
  let m;
  if ((m = path.match(/^\/runs\/([^/]+)$/))) stopPage = runPage(main, decodeURIComponent(m[1]), {notice});
  else if ((m = path.match(/^\/sessions\/([^/]+)$/))) stopPage = runsPage(main, {session: decodeURIComponent(m[1]), status, page, notice, go});
  else stopPage = runsPage(main, {status, page, notice, go});
}

window.addEventListener('hashchange', route);
route();
