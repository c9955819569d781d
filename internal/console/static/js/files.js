// A session's files: browse the workspace a directory at a time,
// download (fetch with the key, then a blob: a plain link cannot carry
// the key), upload into the directory shown, delete.
import {h, replace, bytes, timeEl, confirm, save, pathURL} from './dom.js';
import {call, request, q} from './api.js';

export function filesSection(page) {
  const {ctx, sid} = page;
  let dir = '';
  const crumbs = h('p', {id: 'files-path', class: 'crumbs'});
  const body = h('tbody', {id: 'files-body'});
  const msg = h('p', {id: 'files-status', role: 'status'});
  const input = h('input', {id: 'upload-input', type: 'file', multiple: true});

  const say = (text, bad) => { msg.className = bad ? 'error' : 'muted'; msg.textContent = text; };

  const download = async (f) => {
    say(`Downloading ${f.path}…`);
    try {
      const res = await request('GET', `/api/v1/sessions/${sid}/files/${pathURL(f.path)}`, {signal: ctx.signal});
      save(await res.blob(), f.name);
      say(`Downloaded ${f.path}.`);
    } catch (e) { say(`${f.path}: ${e.message}`, true); }
  };
  const remove = async (f) => {
    if (!await confirm(`Delete ${f.path}${f.type === 'dir' ? ' and everything in it' : ''}?`, 'Delete')) return;
    try {
      await call('DELETE', `/api/v1/sessions/${sid}/files/${pathURL(f.path)}${q({recursive: f.type === 'dir' ? 'true' : ''})}`);
      say(`Deleted ${f.path}.`);
    } catch (e) { say(`${f.path}: ${e.message}`, true); }
    refresh();
  };
  const go = (d) => { dir = d; refresh(); };

  const refresh = async () => {
    const parts = dir ? dir.split('/') : [];
    replace(crumbs, h('button', {type: 'button', class: 'link', onclick: () => go('')}, 'workspace'),
      parts.map((p, i) => [' / ', h('button', {type: 'button', class: 'link', onclick: () => go(parts.slice(0, i + 1).join('/'))}, p)]));
    try {
      const list = await call('GET', `/api/v1/sessions/${sid}/files${q({path: dir})}`, {signal: ctx.signal});
      const files = list.files.slice().sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name));
      replace(body, files.length ? files.map((f) => h('tr', {dataset: {path: f.path}},
        h('th', {scope: 'row', class: 'name'}, f.type === 'dir'
          ? h('button', {type: 'button', class: 'link', onclick: () => go(f.path)}, `${f.name}/`)
          : f.name),
        h('td', null, f.type),
        h('td', null, f.type === 'file' ? bytes(f.size) : ''),
        h('td', null, timeEl(f.modified_at)),
        h('td', {class: 'row'},
          f.type === 'file' ? h('button', {type: 'button', class: 'download', onclick: () => download(f)}, 'Download') : null,
          h('button', {type: 'button', class: 'danger', onclick: () => remove(f)}, 'Delete…'))))
        : h('tr', null, h('td', {colspan: 5, class: 'muted'}, 'Empty.')));
      if (list.truncated) body.append(h('tr', null, h('td', {colspan: 5, class: 'muted'}, 'More entries than one listing shows.')));
      body.dataset.dir = dir;
    } catch (e) {
      if (!ctx.signal.aborted) replace(body, h('tr', null, h('td', {colspan: 5, class: 'error'}, e.message)));
    }
  };

  const upload = h('form', {id: 'upload-form', class: 'row', onsubmit: async (ev) => {
    ev.preventDefault();
    if (!input.files.length) { say('Choose files first.', true); return; }
    // The text fields go before the files: the server reads them first.
    const fd = new FormData();
    if (dir) fd.append('path', `${dir}/`);
    for (const f of input.files) fd.append('file', f, f.name);
    say(`Uploading ${input.files.length} file(s)…`);
    try {
      const r = await call('POST', `/api/v1/sessions/${sid}/files/upload`, {body: fd});
      say(`Uploaded ${r.files.map((f) => f.path).join(', ')}.`);
      input.value = '';
    } catch (e) { say(`Upload: ${e.message}`, true); }
    refresh();
  }},
  h('label', {for: 'upload-input'}, 'Upload into this folder'), input,
  h('button', {type: 'submit', id: 'upload-submit'}, 'Upload'));

  refresh();
  return {refresh, el: h('section', {id: 'files', 'aria-labelledby': 'files-h'},
    h('div', {class: 'row spread'}, h('h2', {id: 'files-h'}, 'Files'), h('button', {type: 'button', onclick: () => refresh()}, 'Refresh')),
    crumbs, h('div', {class: 'scroll'}, h('table', null,
      h('thead', null, h('tr', null, ['Name', 'Type', 'Size', 'Modified', ''].map((c) => h('th', {scope: 'col'}, c)))),
      body)),
    upload, msg)};
}
