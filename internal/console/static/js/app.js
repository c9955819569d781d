// The console's shell: sign-in, navigation and the hash router. Each page
// is a function of a view context; leaving the page aborts its requests
// and stops its timers.
import {h, replace, $, tick} from './dom.js';
import {auth, probe, request} from './api.js';
import {sessionsView} from './sessions.js';
import {sessionView} from './session.js';
import {templatesView, templateView} from './templates.js';
import {poolsView} from './pools.js';

const routes = [
  [/^#\/sessions\/([^/]+)$/, (ctx, m) => sessionView(ctx, decodeURIComponent(m[1]))],
  [/^#\/sessions$/, (ctx) => sessionsView(ctx)],
  [/^#\/templates\/([^/]+)$/, (ctx, m) => templateView(ctx, decodeURIComponent(m[1]))],
  [/^#\/templates$/, (ctx) => templatesView(ctx)],
  [/^#\/pools$/, (ctx) => poolsView(ctx)],
];

const main = $('#main');
let current = null; // the view context of the page shown
let signedIn = false;

function newContext() {
  const ac = new AbortController();
  const timers = [];
  return {
    main,
    signal: ac.signal,
    // every runs fn every ms while the page is shown.
    every(ms, fn) { timers.push(setInterval(() => { if (!ac.signal.aborted) fn(); }, ms)); },
    title(t) { document.title = `${t} · sbx`; },
    close() { ac.abort(); timers.forEach(clearInterval); },
  };
}

async function route() {
  const hash = location.hash;
  if (hash && !hash.startsWith('#/')) return; // an in-page anchor (the skip link)
  if (!signedIn) return;
  if (current) current.close();
  const ctx = current = newContext();
  for (const a of document.querySelectorAll('#nav a')) {
    const here = hash.startsWith(a.getAttribute('href'));
    if (here) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  const found = routes.find(([re]) => re.test(hash));
  if (!found) { location.replace('#/sessions'); return; }
  replace(main);
  try {
    await found[1](ctx, hash.match(found[0]));
  } catch (e) {
    if (!ctx.signal.aborted) showError(main, e);
  }
  if (!ctx.signal.aborted) main.focus({preventScroll: true});
}

export function showError(el, e) {
  el.append(h('p', {class: 'error', role: 'alert'}, e && e.message ? e.message : String(e)));
}

function signInView(message) {
  signedIn = false;
  if (current) { current.close(); current = null; }
  document.title = 'Sign in · sbx';
  $('#nav').hidden = true;
  $('#signout').hidden = true;
  $('#who').textContent = '';
  const input = h('input', {id: 'signin-key', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false'});
  const status = h('p', {id: 'signin-status', class: 'error', role: 'alert'}, message || '');
  const form = h('form', {id: 'signin', class: 'card narrow', onsubmit: async (ev) => {
    ev.preventDefault();
    status.textContent = '';
    const key = input.value.trim();
    try {
      if (await probe(key)) {
        auth.key = key;
        enter();
      } else {
        status.textContent = 'The server refused this key.';
      }
    } catch (e) {
      status.textContent = e.message;
    }
  }},
  h('h1', null, 'Sign in'),
  h('p', null, 'This server needs an API key. It is kept in this tab only (sessionStorage) and sent with each API call.'),
  h('label', {for: 'signin-key'}, 'API key'), input,
  h('div', {class: 'row'}, h('button', {type: 'submit', class: 'primary'}, 'Sign in')),
  status);
  replace(main, form);
  input.focus();
}

function enter() {
  signedIn = true;
  $('#nav').hidden = false;
  $('#signout').hidden = auth.noKey;
  $('#who').textContent = auth.noKey ? 'no-key mode (loopback)' : 'signed in';
  // A new hash routes through hashchange; the same one needs a call.
  if (!location.hash.startsWith('#/')) location.replace('#/sessions');
  else route();
}

async function start() {
  $('#signout').addEventListener('click', () => {
    auth.key = '';
    signInView('Signed out.');
  });
  auth.onUnauthorized = () => {
    if (auth.noKey) return;
    auth.key = '';
    signInView('The server no longer takes this key; sign in again.');
  };
  window.addEventListener('hashchange', route);
  setInterval(() => tick(main), 1000);
  // Pools come from the Prometheus endpoint, which answers without a
  // credential only on a server without API keys (with keys it asks for
  // the operator's metrics token, never a tenant's key) and may be out of
  // reach (a proxy in front of the API): the link shows only if it
  // answers. data-probed says the probe is over.
  const pools = $('#nav-pools');
  request('GET', '/metrics', {key: ''}).then(
    () => { pools.hidden = false; pools.dataset.probed = 'yes'; },
    () => { pools.dataset.probed = 'no'; });
  try {
    if (auth.key && await probe(auth.key)) { enter(); return; }
    if (await probe('')) { auth.noKey = true; auth.key = ''; enter(); return; }
    const stale = !!auth.key;
    auth.key = '';
    signInView(stale ? 'The server no longer takes the key this tab had; sign in again.' : '');
  } catch (e) {
    replace(main);
    showError(main, new Error(`The server cannot be reached: ${e.message}`));
  }
}

start();
