// route.js: reading a route from the URL's fragment (pure, so that node
// tests it). The fragment is whatever the address bar holds: a link
// pasted, cut short or typed by hand may hold an ID that is not valid
// percent-encoding (#/runs/%E0%A4%A), on which decodeURIComponent
// throws. Such a route is {page: 'invalid'} with a message that says
// which link is broken, so that the console shows it instead of staying
// on the page it was on.

// parseRoute reads hash (location.hash; '' is the Runs list) into
// {page, id, status, agent, size, hash, message}: page is 'signin',
// 'runs', 'session', 'run', 'agents', 'agent' or 'invalid'; id the
// session's or Run's ID, or the agent's name; status and agent the
// list's ?status= and ?agent=; size the list's ?page= (1 to 500, else
// undefined); message, for 'invalid', what is wrong.
export function parseRoute(hash) {
  hash = hash || '#/runs';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const status = params.get('status') || '';
  const agent = params.get('agent') || '';
  const n = Number(params.get('page'));
  const size = Number.isInteger(n) && n >= 1 && n <= 500 ? n : undefined;
  const base = {hash, path, status, agent, size};
  if (path === '/signin') return {...base, page: 'signin'};
  if (path === '/agents') return {...base, page: 'agents'};
  let m;
  if ((m = path.match(/^\/runs\/([^/]+)$/))) return withID(base, 'run', 'Run', m[1]);
  if ((m = path.match(/^\/sessions\/([^/]+)$/))) return withID(base, 'session', 'session', m[1]);
  if ((m = path.match(/^\/agents\/([^/]+)$/))) return withID(base, 'agent', 'agent', m[1]);
  return {...base, page: 'runs'};
}

// listHash is the route of a list of Runs (path '#/runs' or a session's)
// with its filters: the ones that are empty are left out, so that
// listHash('#/runs', {}) is '#/runs'. parseRoute reads them back.
export function listHash(path, {status = '', agent = '', size} = {}) {
  const q = new URLSearchParams();
  if (status) q.set('status', status);
  if (agent) q.set('agent', agent);
  if (size) q.set('page', String(size));
  const s = q.toString();
  return s ? path + '?' + s : path;
}

// agentHash is the route of an agent's page.
export function agentHash(name) {
  return '#/agents/' + encodeURIComponent(name);
}

function withID(base, page, what, raw) {
  try {
    return {...base, page, id: decodeURIComponent(raw)};
  } catch {
    return {...base, page: 'invalid', what,
      message: 'This is not a valid ' + what + ' link: its ID "' + raw + '" is not valid percent-encoding ' +
        '(the link may have been cut short). Check the link, or find the ' + what +
        (what === 'agent' ? ' in the list of agents.' : ' in the list of Runs.')};
  }
}
