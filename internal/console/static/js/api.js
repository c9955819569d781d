// The API, with the key the user gave. The key is kept in sessionStorage:
// it lasts as long as the tab, is not sent by the browser on its own (no
// cookie, so no cross-site request can use it) and is gone on sign out.
//
// Every call names its method as a string and its path as a template
// literal whose ${...} are whole segments, with any query as a q({...})
// at its end: internal/console's tests read them and check each against
// api/openapi.yaml.

const KEY = 'sbx.apiKey';

export const auth = {
  get key() { return sessionStorage.getItem(KEY) || ''; },
  set key(k) { if (k) sessionStorage.setItem(KEY, k); else sessionStorage.removeItem(KEY); },
  // noKey: the server answered without a key (no-key mode, loopback).
  noKey: false,
  // onUnauthorized runs when a call is refused for its key.
  onUnauthorized: () => {},
};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code;
  }
}

async function toError(res) {
  let code = '', msg = `${res.status} ${res.statusText}`;
  try {
    const b = await res.json();
    if (b && b.error) { code = b.error.code; msg = b.error.message; }
  } catch { /* not JSON */ }
  return new ApiError(res.status, code, msg);
}

// request sends a request and returns the Response; an error status
// throws ApiError. opts: json (a body sent as JSON), body, headers,
// signal, key (this key instead of the stored one).
export async function request(method, path, opts = {}) {
  const headers = new Headers(opts.headers);
  const key = opts.key !== undefined ? opts.key : auth.key;
  if (key) headers.set('Authorization', `Bearer ${key}`);
  let body = opts.body;
  if (opts.json !== undefined) {
    headers.set('Content-Type', 'application/json');
    body = JSON.stringify(opts.json);
  }
  const res = await fetch(path, {method, headers, body, signal: opts.signal, cache: 'no-store', credentials: 'omit'});
  if (!res.ok) {
    const err = await toError(res);
    if (res.status === 401 && opts.key === undefined) auth.onUnauthorized(err);
    throw err;
  }
  return res;
}

// call is request for a JSON answer (null when there is no body).
export async function call(method, path, opts) {
  const res = await request(method, path, opts);
  if (res.status === 204) return null;
  const ct = res.headers.get('Content-Type') || '';
  return ct.startsWith('application/json') ? res.json() : null;
}

// stream sends a request asking for server-sent events and calls
// onEvent(name, data) for each as it arrives (fetch and a stream reader:
// EventSource cannot send the key). It returns when the stream ends.
export async function stream(method, path, opts, onEvent) {
  const headers = new Headers(opts.headers);
  headers.set('Accept', 'text/event-stream');
  const res = await request(method, path, {...opts, headers});
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '', name = '', data = [];
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      let line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') {
        if (data.length) onEvent(name || 'message', data.join('\n'));
        name = ''; data = [];
      } else if (line.startsWith(':')) {
        // a keep-alive comment
      } else {
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        let v = i < 0 ? '' : line.slice(i + 1);
        if (v.startsWith(' ')) v = v.slice(1);
        if (field === 'event') name = v;
        else if (field === 'data') data.push(v);
      }
    }
  }
}

// probe says whether the server takes key (or no key at all): true, or
// false for a key it refuses; anything else throws.
export async function probe(key) {
  try {
    await request('GET', `/api/v1/sessions${q({limit: 1})}`, {key});
    return true;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return false;
    throw e;
  }
}

// q is a query string of the set values of o ("" when none is set).
export function q(o) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(o)) if (v !== undefined && v !== null && v !== '') p.set(k, v);
  const s = p.toString();
  return s ? `?${s}` : '';
}
