// A session's page: its state and actions, code to run with live output,
// its executions, files, metrics, snapshots and events.
import {h, replace, badge, timeEl, countdown, confirm, bytes} from './dom.js';
import {call} from './api.js';
import {nextStep} from './sessions.js';
import {runSection, executionsSection} from './run.js';
import {filesSection} from './files.js';
import {metricsSection} from './metrics.js';
import {eventsSection} from './events.js';

export async function sessionView(ctx, id) {
  ctx.title(id);
  const sid = encodeURIComponent(id);
  const s = await call('GET', `/api/v1/sessions/${sid}`, {signal: ctx.signal});
  const head = h('div', {id: 'session-head'});
  const msg = h('p', {id: 'action-status', role: 'status', 'aria-live': 'polite'});
  const page = {ctx, id, sid, session: s, msg};

  page.showSession = (s) => {
    page.session = s;
    replace(head, overview(s));
    for (const b of head.ownerDocument.querySelectorAll('#session-actions button')) b.disabled = s.status === 'terminated';
  };
  page.refresh = async () => {
    try { page.showSession(await call('GET', `/api/v1/sessions/${sid}`, {signal: ctx.signal})); } catch { /* shown at the next action */ }
  };
  // act runs an action, saying what happened; it reports failures in the
  // page rather than throwing.
  page.act = async (label, fn) => {
    msg.className = '';
    msg.textContent = `${label}…`;
    try {
      await fn();
      msg.textContent = `${label}: done.`;
    } catch (e) {
      msg.className = 'error';
      msg.textContent = `${label}: ${e.message}`;
    }
    await page.refresh();
  };

  const run = runSection(page);
  const execs = executionsSection(page);
  const files = filesSection(page);
  page.afterRun = () => { execs.refresh(); files.refresh(); page.refresh(); };
  const snaps = snapshotsSection(page);

  replace(ctx.main,
    h('p', {class: 'crumbs'}, h('a', {href: '#/sessions'}, 'Sessions'), ' / '),
    h('h1', {id: 'session-title'}, id),
    head, actions(page), msg,
    h('div', {class: 'grid'}, run.el, execs.el),
    files.el,
    metricsSection(page),
    snaps.el,
    eventsSection(page));
  page.showSession(s);
  ctx.every(5000, page.refresh);
}

function overview(s) {
  const r = s.resources || {};
  const meta = Object.entries(s.metadata || {});
  return h('dl', {class: 'facts'},
    h('dt', null, 'Status'), h('dd', {id: 'session-status'}, badge(s.status), s.error ? h('span', {class: 'error'}, ' ', s.error) : null),
    h('dt', null, 'Sandbox'), h('dd', {id: 'session-sandbox'}, s.sandbox_state),
    h('dt', null, 'Template'), h('dd', null, h('a', {href: `#/templates/${encodeURIComponent(s.template_id)}`}, s.template_id)),
    h('dt', null, 'Created'), h('dd', null, timeEl(s.created_at)),
    h('dt', null, 'Last activity'), h('dd', null, timeEl(s.last_activity_at)),
    h('dt', null, 'Idle'), h('dd', null, nextStep(s) || '—'),
    h('dt', null, 'Expires'), h('dd', null, timeEl(s.expires_at), ' ', s.status === 'terminated' ? null : countdown(Date.parse(s.expires_at), 'ends')),
    h('dt', null, 'Resources'), h('dd', null, `${r.cpu || 'default'} CPU, ${r.memory ? r.memory + ' MiB' : 'default'} memory, ${r.disk ? r.disk + ' MiB' : 'default'} disk`),
    h('dt', null, 'Network'), h('dd', null, s.network || 'none'),
    meta.length ? [h('dt', null, 'Metadata'), h('dd', null, meta.map(([k, v]) => h('code', {class: 'tag'}, `${k}=${v}`)))] : null);
}

function actions(page) {
  const {sid} = page;
  const b = (id, label, fn, cls) => h('button', {type: 'button', id, class: cls || null, onclick: fn}, label);
  return h('div', {id: 'session-actions', class: 'row', role: 'group', 'aria-label': 'Session actions'},
    b('act-pause', 'Pause', () => page.act('Pause', () => call('POST', `/api/v1/sessions/${sid}/pause`))),
    b('act-hibernate', 'Hibernate', () => page.act('Hibernate', () => call('POST', `/api/v1/sessions/${sid}/hibernate`))),
    b('act-resume', 'Resume', () => page.act('Resume', () => call('POST', `/api/v1/sessions/${sid}/resume`))),
    b('act-keepalive', 'Keep alive', () => page.act('Keep alive', () => call('POST', `/api/v1/sessions/${sid}/keepalive`))),
    b('act-delete', 'Delete…', async () => {
      if (!await confirm(`Delete session ${page.id}? Its sandbox is killed and its files are removed.`, 'Delete')) return;
      await page.act('Delete', () => call('DELETE', `/api/v1/sessions/${sid}`));
      if (page.session.status === 'terminated') location.hash = '#/sessions';
    }, 'danger'));
}

function snapshotsSection(page) {
  const {ctx, sid} = page;
  const body = h('tbody');
  const load = async () => {
    const list = await call('GET', `/api/v1/sessions/${sid}/snapshots`, {signal: ctx.signal});
    replace(body, list.snapshots.length ? list.snapshots.slice().reverse().map((sn) => {
      const snid = encodeURIComponent(sn.snapshot_id);
      return h('tr', null,
        h('th', {scope: 'row'}, h('code', null, sn.snapshot_id)),
        h('td', null, timeEl(sn.created_at)),
        h('td', null, `${sn.files} files, ${sn.dirs} dirs`),
        h('td', null, bytes(sn.bytes)),
        h('td', {class: 'row'},
          h('button', {type: 'button', onclick: async () => {
            if (!await confirm(`Restore ${sn.snapshot_id}? The workspace is replaced by the snapshot's and the sandbox is restarted.`, 'Restore')) return;
            await page.act('Restore', () => call('POST', `/api/v1/sessions/${sid}/snapshots/${snid}/restore`));
          }}, 'Restore…'),
          h('button', {type: 'button', class: 'danger', onclick: async () => {
            if (!await confirm(`Delete snapshot ${sn.snapshot_id}?`, 'Delete')) return;
            await page.act('Delete snapshot', () => call('DELETE', `/api/v1/sessions/${sid}/snapshots/${snid}`));
            load().catch(() => {});
          }}, 'Delete…')));
    }) : h('tr', null, h('td', {colspan: 5, class: 'muted'}, 'No snapshots.')));
  };
  const el = h('section', {id: 'snapshots', 'aria-labelledby': 'snapshots-h'},
    h('div', {class: 'row spread'}, h('h2', {id: 'snapshots-h'}, 'Snapshots'),
      h('button', {type: 'button', id: 'snapshot-create', onclick: () => page.act('Snapshot', async () => {
        await call('POST', `/api/v1/sessions/${sid}/snapshots`);
        await load();
      })}, 'Take snapshot')),
    h('div', {class: 'scroll'}, h('table', null,
      h('thead', null, h('tr', null, ['Snapshot', 'Taken', 'Contents', 'Size', ''].map((c) => h('th', {scope: 'col'}, c)))),
      body)));
  load().catch((e) => replace(body, h('tr', null, h('td', {colspan: 5, class: 'error'}, e.message))));
  return {el};
}
