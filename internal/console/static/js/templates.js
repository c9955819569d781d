// Templates: the ones a session can use, a form to define one of the
// tenant's own, and a template's page with its latest build's log as it
// grows.
import {h, replace, badge, timeEl, bytes, confirm} from './dom.js';
import {call, stream, q} from './api.js';

const short = (hash) => (hash ? hash.slice(0, 12) : '—');

export async function templatesView(ctx) {
  ctx.title('Templates');
  const body = h('tbody', {id: 'templates-body'});
  const load = async () => {
    const list = await call('GET', `/api/v1/templates`, {signal: ctx.signal});
    replace(body, list.templates.map((t) => h('tr', {dataset: {template: t.name}},
      h('th', {scope: 'row'}, h('a', {href: `#/templates/${encodeURIComponent(t.name)}`}, t.name)),
      h('td', null, t.source),
      h('td', null, badge(t.status)),
      h('td', null, h('code', {title: t.hash}, short(t.hash))),
      h('td', null, t.size_bytes ? bytes(t.size_bytes) : '—'),
      h('td', null, t.runtime || 'runc'),
      h('td', null, t.release))));
  };
  replace(ctx.main,
    h('h1', null, 'Templates'),
    h('div', {class: 'scroll'}, h('table', {id: 'templates'},
      h('thead', null, h('tr', null, ['Name', 'Source', 'Status', 'Version', 'Size', 'Runtime', 'Release'].map((c) => h('th', {scope: 'col'}, c)))),
      body)),
    createForm());
  await load();
  ctx.every(5000, () => load().catch(() => {}));
}

function createForm() {
  const spec = h('textarea', {id: 'template-spec', rows: 8, spellcheck: 'false'},
    JSON.stringify({name: 'my-tools', packages: ['jq'], env: {}, timeout: '60s'}, null, 2));
  const msg = h('p', {class: 'error', role: 'alert'});
  return h('section', {'aria-labelledby': 'template-new-h'},
    h('h2', {id: 'template-new-h'}, 'Define a template'),
    h('p', {class: 'muted'}, 'A JSON spec, as `sbx template build --file` takes it: name, release, packages, env, files, resources, timeout, runtime, preload. Posting a name again makes a new version.'),
    h('form', {id: 'template-form', onsubmit: async (ev) => {
      ev.preventDefault();
      msg.textContent = '';
      let body;
      try { body = JSON.parse(spec.value); } catch (e) { msg.textContent = `Not JSON: ${e.message}`; return; }
      try {
        const t = await call('POST', `/api/v1/templates`, {json: body});
        location.hash = `#/templates/${encodeURIComponent(t.name)}`;
      } catch (e) { msg.textContent = e.message; }
    }},
    h('label', {for: 'template-spec'}, 'Spec'), spec,
    h('div', {class: 'row'}, h('button', {type: 'submit', class: 'primary'}, 'Build')), msg));
}

export async function templateView(ctx, name) {
  ctx.title(name);
  const tn = encodeURIComponent(name);
  const info = h('div', {id: 'template-info'});
  const log = h('pre', {id: 'build-log', class: 'out log', 'aria-live': 'polite', 'aria-label': 'Build log'});
  const logState = h('p', {class: 'muted', role: 'status'});
  const msg = h('p', {role: 'status'});
  let t = await call('GET', `/api/v1/templates/${tn}`, {signal: ctx.signal});

  const act = async (label, fn) => {
    msg.className = ''; msg.textContent = `${label}…`;
    try { await fn(); msg.textContent = `${label}: done.`; } catch (e) { msg.className = 'error'; msg.textContent = `${label}: ${e.message}`; }
  };
  const show = () => {
    const b = t.build;
    replace(info,
      h('dl', {class: 'facts'},
        h('dt', null, 'Status'), h('dd', null, badge(t.status), t.last_error ? h('span', {class: 'error'}, ' ', t.last_error) : null),
        h('dt', null, 'Source'), h('dd', null, t.source),
        h('dt', null, 'Version'), h('dd', null, h('code', null, t.hash || '—')),
        h('dt', null, 'Size'), h('dd', null, t.size_bytes ? bytes(t.size_bytes) : '—'),
        h('dt', null, 'Runtime'), h('dd', null, t.runtime || 'runc'),
        h('dt', null, 'Release'), h('dd', null, t.release),
        h('dt', null, 'Built'), h('dd', null, timeEl(t.built_at)),
        b ? [h('dt', null, 'Latest build'), h('dd', null, h('code', null, b.build_id), ' ', badge(b.status), ' queued ', timeEl(b.queued_at),
          b.finished_at ? [' finished ', timeEl(b.finished_at)] : null, b.error && b.error !== t.last_error ? h('span', {class: 'error'}, ' ', b.error) : null)] : null),
      t.versions && t.versions.length ? [h('h2', null, 'Versions'), h('ul', null, t.versions.map((v) =>
        h('li', null, h('code', null, short(v.hash)), ` ${bytes(v.size_bytes)}, built `, timeEl(v.built_at))))] : null,
      h('div', {class: 'row'},
        b && (b.status === 'queued' || b.status === 'building')
          ? h('button', {type: 'button', id: 'build-cancel', onclick: () => act('Cancel build', async () => {
            t = await call('POST', `/api/v1/templates/${tn}/builds/${encodeURIComponent(b.build_id)}/cancel`);
            show();
          })}, 'Cancel build') : null,
        t.source === 'tenant' ? h('button', {type: 'button', class: 'danger', id: 'template-delete', onclick: async () => {
          if (!await confirm(`Delete template ${name}? Sessions that use it keep their build only if you force it.`, 'Delete')) return;
          await act('Delete', async () => {
            try {
              await call('DELETE', `/api/v1/templates/${tn}`);
            } catch (e) {
              if (e.status !== 409 || !await confirm(`${e.message} Delete anyway (the sessions go on with the build they run)?`, 'Force delete')) throw e;
              await call('DELETE', `/api/v1/templates/${tn}${q({force: 'true'})}`);
            }
            location.hash = '#/templates';
          });
        }}, 'Delete…') : null));
  };

  replace(ctx.main,
    h('p', {class: 'crumbs'}, h('a', {href: '#/templates'}, 'Templates'), ' / '),
    h('h1', null, name), info, msg,
    h('section', {'aria-labelledby': 'build-log-h'}, h('h2', {id: 'build-log-h'}, 'Build log'), logState, log));
  show();

  if (!t.build) {
    logState.textContent = t.source === 'tenant' ? 'No build.' : `A ${t.source} template: built by the server, no build log here.`;
    return;
  }
  logState.textContent = 'Streaming…';
  const bid = encodeURIComponent(t.build.build_id);
  try {
    await stream('GET', `/api/v1/templates/${tn}/builds/${bid}/logs`, {signal: ctx.signal}, (ev, data) => {
      const d = JSON.parse(data);
      if (ev === 'log') log.append(document.createTextNode(d.text));
      else if (ev === 'end') { t = d; show(); logState.textContent = `The build ended: ${d.build ? d.build.status : d.status}.`; }
    });
  } catch (e) {
    if (!ctx.signal.aborted) logState.textContent = e.message;
  }
}
