// The sessions page: the tenant's sessions with their state, template and
// the next lifecycle step as a countdown, filtered by status and text,
// refreshed every few seconds; and a form to create one.
import {h, replace, badge, timeEl, countdown} from './dom.js';
import {call, q} from './api.js';

const filters = {status: 'active', text: ''}; // kept while the tab lives
const MAX_PAGES = 10;

// nextStep is what the reaper does next to an idle session, and when.
export function nextStep(s) {
  const last = Date.parse(s.last_activity_at);
  if (s.status === 'terminated' || s.status === 'hibernated' || s.status === 'error') return null;
  if (s.sandbox_state === 'running' || s.sandbox_state === 'starting') return countdown(last + s.idle_timeout * 1000, 'pause');
  return countdown(last + s.hibernate_timeout * 1000, 'hibernate');
}

function matches(s, text) {
  if (filters.status === 'active' && s.status === 'terminated') return false;
  if (!text) return true;
  const hay = [s.session_id, s.template_id, s.status, ...Object.entries(s.metadata || {}).flat()].join(' ').toLowerCase();
  return hay.includes(text.toLowerCase());
}

function row(s) {
  return h('tr', {dataset: {session: s.session_id}},
    h('th', {scope: 'row'}, h('a', {href: `#/sessions/${encodeURIComponent(s.session_id)}`}, s.session_id)),
    h('td', null, badge(s.status)),
    h('td', null, s.sandbox_state),
    h('td', null, s.template_id),
    h('td', null, timeEl(s.created_at)),
    h('td', null, nextStep(s) || '—'),
    h('td', null, s.status === 'terminated' ? '—' : countdown(Date.parse(s.expires_at), 'ends')));
}

export async function sessionsView(ctx) {
  ctx.title('Sessions');
  const status = h('select', {id: 'filter-status'},
    ['active', 'all', 'pending', 'running', 'paused', 'hibernated', 'error', 'terminated'].map((v) =>
      h('option', {value: v, selected: v === filters.status}, v === 'active' ? 'not terminated' : v)));
  const text = h('input', {id: 'filter-text', type: 'search', value: filters.text, placeholder: 'id, template, metadata'});
  const count = h('p', {id: 'sessions-count', class: 'muted', 'aria-live': 'polite'});
  const body = h('tbody', {id: 'sessions-body'});
  const table = h('table', {id: 'sessions'},
    h('caption', {class: 'sr-only'}, 'Sessions'),
    h('thead', null, h('tr', null, ['Session', 'Status', 'Sandbox', 'Template', 'Created', 'Idle', 'TTL'].map((c) => h('th', {scope: 'col'}, c)))),
    body);
  const err = h('div');
  let list = [], more = false, shown = '';

  const render = () => {
    const rows = list.filter((s) => matches(s, filters.text));
    const key = JSON.stringify([rows, filters]);
    if (key === shown) return; // keep focus and selection while nothing changed
    shown = key;
    replace(body, rows.length ? rows.map(row) : h('tr', null, h('td', {colspan: 7, class: 'muted'}, 'No sessions.')));
    count.textContent = `${rows.length} of ${list.length} session${list.length === 1 ? '' : 's'}${more ? ' (the first ' + list.length + ' only)' : ''}`;
    table.dataset.loaded = 'true';
  };
  const load = async () => {
    const st = filters.status === 'active' || filters.status === 'all' ? '' : filters.status;
    const got = [];
    let token = '', pages = 0;
    do {
      const page = await call('GET', `/api/v1/sessions${q({status: st, limit: 100, page_token: token})}`, {signal: ctx.signal});
      got.push(...page.sessions);
      token = page.next_page_token || '';
    } while (token && ++pages < MAX_PAGES);
    list = got;
    more = !!token;
    replace(err);
    render();
  };
  const refresh = () => load().catch((e) => { if (!ctx.signal.aborted) replace(err, h('p', {class: 'error', role: 'alert'}, e.message)); });

  status.addEventListener('change', () => { filters.status = status.value; refresh(); });
  text.addEventListener('input', () => { filters.text = text.value; render(); });

  replace(ctx.main,
    h('div', {class: 'row spread'}, h('h1', null, 'Sessions'), createForm(ctx)),
    h('div', {class: 'row filters', role: 'search'},
      h('label', {for: 'filter-status'}, 'Status'), status,
      h('label', {for: 'filter-text'}, 'Filter'), text),
    err, count, h('div', {class: 'scroll'}, table));
  await load();
  ctx.every(5000, refresh);
}

function createForm(ctx) {
  const id = h('input', {id: 'new-session-id', placeholder: 'optional', pattern: '[A-Za-z0-9][A-Za-z0-9._\\-]{0,127}'});
  const tmpl = h('select', {id: 'new-session-template'}, h('option', {value: 'python'}, 'python'));
  const msg = h('p', {class: 'error', role: 'alert'});
  const form = h('form', {class: 'inline', onsubmit: async (ev) => {
    ev.preventDefault();
    msg.textContent = '';
    try {
      const s = await call('POST', `/api/v1/sessions`, {json: {session_id: id.value || undefined, template_id: tmpl.value}});
      location.hash = `#/sessions/${encodeURIComponent(s.session_id)}`;
    } catch (e) { msg.textContent = e.message; }
  }},
  h('label', {for: 'new-session-id'}, 'New session'), id,
  h('label', {for: 'new-session-template', class: 'sr-only'}, 'Template'), tmpl,
  h('button', {type: 'submit'}, 'Create'), msg);
  call('GET', `/api/v1/templates`, {signal: ctx.signal}).then((t) => {
    replace(tmpl, t.templates.filter((x) => x.status !== 'failed' && x.status !== 'cancelled')
      .map((x) => h('option', {value: x.name, selected: x.name === 'python'}, x.name)));
  }, () => {});
  return form;
}
