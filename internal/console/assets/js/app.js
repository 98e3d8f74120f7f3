// app.js: the console's routes (in the URL's fragment, so the server
// serves one page) and its sign-in. Routes:
//   #/signin              the token form
//   #/runs[?status=S][&agent=A][&page=N]  the tenant's Runs (N a page, default 50)
//   #/sessions/ID         one session's Runs (the same filters)
//   #/runs/ID             one Run
//   #/agents              the tenant's agents
//   #/agents/NAME         one agent, with its instructions

import {el, replace} from './dom.js';
import {token, setToken, clearToken, whenUnauthorized, request, get, ApiError} from './api.js';
import {runsPage} from './runs.js';
import {runPage} from './run.js';
import {agentsPage} from './agents.js';
import {parseRoute} from './route.js';

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

function go(to) {
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

// invalidLinkPage says that the route's link is broken, instead of
// leaving the page that was shown before.
function invalidLinkPage(r) {
  replace(main, el('section', {class: 'card notfound', id: 'invalid-link'},
    el('h1', {text: 'Not a valid ' + r.what + ' link'}),
    el('p', {text: r.message}),
    r.what === 'agent' ? el('p', {}, el('a', {href: '#/agents', text: 'Back to the agents'}))
      : el('p', {}, el('a', {href: '#/runs', text: 'Back to the Runs'}))));
  return () => {};
}

function route() {
  stopPage();
  banner.hidden = true;
  const r = parseRoute(location.hash);
  const {status, agent, size: page} = r;
  nav.hidden = !token();
  if (!token() || r.page === 'signin') {
    if (token() && r.page === 'signin') { stopPage = runsPage(main, {status, agent, notice, go}); return; }
    if (!token() && r.page !== 'signin') afterSignin = r.hash;
    stopPage = signinPage();
    return;
  }
  showTenant();
  if (r.page === 'invalid') stopPage = invalidLinkPage(r);
  else if (r.page === 'run') stopPage = runPage(main, r.id, {notice});
  else if (r.page === 'agents') stopPage = agentsPage(main, '', {notice});
  else if (r.page === 'agent') stopPage = agentsPage(main, r.id, {notice});
  else if (r.page === 'session') stopPage = runsPage(main, {session: r.id, status, agent, page, notice, go});
  else stopPage = runsPage(main, {status, agent, page, notice, go});
}

window.addEventListener('hashchange', route);
route();
