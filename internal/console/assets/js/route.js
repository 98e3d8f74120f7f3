// route.js: reading a route from the URL's fragment (pure, so that node
// tests it). The fragment is whatever the address bar holds: a link
// pasted, cut short or typed by hand may hold an ID that is not valid
// percent-encoding (#/runs/%E0%A4%A), on which decodeURIComponent
// throws. Such a route is {page: 'invalid'} with a message that says
// which link is broken, so that the console shows it instead of staying
// on the page it was on.

// parseRoute reads hash (location.hash; '' is the Runs list) into
// {page, id, status, size, hash, message}: page is 'signin', 'runs',
// 'session', 'run' or 'invalid'; id the session's or Run's ID; status
// the list's ?status=; size the list's ?page= (1 to 500, else
// undefined); message, for 'invalid', what is wrong.
export function parseRoute(hash) {
  hash = hash || '#/runs';
  const [path, query] = hash.slice(1).split('?');
  const params = new URLSearchParams(query || '');
  const status = params.get('status') || '';
  const n = Number(params.get('page'));
  const size = Number.isInteger(n) && n >= 1 && n <= 500 ? n : undefined;
  const base = {hash, path, status, size};
  if (path === '/signin') return {...base, page: 'signin'};
  let m;
  if ((m = path.match(/^\/runs\/([^/]+)$/))) return withID(base, 'run', 'Run', m[1]);
  if ((m = path.match(/^\/sessions\/([^/]+)$/))) return withID(base, 'session', 'session', m[1]);
  return {...base, page: 'runs'};
}

function withID(base, page, what, raw) {
  try {
    return {...base, page, id: decodeURIComponent(raw)};
  } catch {
    return {...base, page: 'invalid', what,
      message: 'This is not a valid ' + what + ' link: its ID "' + raw + '" is not valid percent-encoding ' +
        '(the link may have been cut short). Check the link, or find the ' + what + ' in the list of Runs.'};
  }
}
