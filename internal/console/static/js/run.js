// Running code in a session with its output as it arrives (the execute
// endpoint's event stream), and the session's executions.
import {h, replace, badge, timeEl, ms} from './dom.js';
import {call, stream, q} from './api.js';

// result shows an execution's outcome: status, return value, error and
// the files it wrote; outputs are shown as the text they are.
export function result(x, withOutput) {
  return h('div', {class: 'result'},
    h('p', null, badge(x.status), ' ', x.duration_ms !== undefined ? ms(x.duration_ms) : '',
      x.exit_code !== undefined ? ` · exit ${x.exit_code}` : ''),
    withOutput && x.stdout ? [h('h4', null, 'stdout'), h('pre', {class: 'out'}, x.stdout)] : null,
    withOutput && x.stderr ? [h('h4', null, 'stderr'), h('pre', {class: 'out err'}, x.stderr)] : null,
    x.return_value !== undefined && x.return_value !== null
      ? [h('h4', null, 'Return value'), h('pre', {class: 'out ret'}, JSON.stringify(x.return_value, null, 2))] : null,
    x.error ? [h('h4', null, 'Error'), h('pre', {class: 'out err'}, `${x.error.type}: ${x.error.message}${x.error.traceback ? '\n' + x.error.traceback : ''}`)] : null,
    x.artifacts && x.artifacts.length ? h('p', null, 'Files written: ', x.artifacts.map((a) => h('code', {class: 'tag'}, a))) : null);
}

export function runSection(page) {
  const {sid} = page;
  const code = h('textarea', {id: 'run-code', rows: 8, spellcheck: 'false', required: true}, 'print("hello from sbx")');
  const lang = h('select', {id: 'run-language'}, h('option', {value: 'python'}, 'python'), h('option', {value: 'bash'}, 'bash'));
  const timeout = h('input', {id: 'run-timeout', type: 'number', min: 1, max: 86400, step: 'any', placeholder: '30'});
  const run = h('button', {type: 'submit', id: 'run-submit', class: 'primary'}, 'Run');
  const cancel = h('button', {type: 'button', id: 'run-cancel', hidden: true}, 'Cancel');
  const state = h('p', {id: 'run-state', class: 'muted', role: 'status'});
  const out = h('pre', {id: 'run-output', class: 'out', 'aria-live': 'polite', 'aria-label': 'Output'});
  const res = h('div', {id: 'run-result'});
  let execId = '', ac = null;

  cancel.addEventListener('click', async () => {
    if (execId) {
      try { await call('POST', `/api/v1/executions/${encodeURIComponent(execId)}/cancel`); } catch (e) { state.textContent = e.message; }
    } else if (ac) ac.abort();
  });
  page.ctx.signal.addEventListener('abort', () => { if (ac) ac.abort(); });

  const form = h('form', {id: 'run-form', onsubmit: async (ev) => {
    ev.preventDefault();
    const req = {code: code.value, language: lang.value};
    if (timeout.value) req.timeout = Number(timeout.value);
    replace(out); replace(res);
    execId = '';
    ac = new AbortController();
    run.disabled = true; cancel.hidden = false;
    state.textContent = 'Submitting…';
    let ended = false;
    try {
      await stream('POST', `/api/v1/sessions/${sid}/execute`, {json: req, signal: ac.signal}, (name, data) => {
        const d = JSON.parse(data);
        if (name === 'submitted') {
          execId = d.execution_id;
          state.textContent = `Running ${execId}…`;
          out.dataset.execution = execId;
        } else if (name === 'stdout' || name === 'stderr') {
          out.append(name === 'stderr' ? h('span', {class: 'err'}, d.text) : document.createTextNode(d.text));
        } else if (name === 'result') {
          ended = true;
          state.textContent = `Execution ${d.execution_id}`;
          replace(res, result(d, false));
          res.dataset.status = d.status;
        } else if (name === 'error') {
          ended = true;
          state.textContent = d.error ? d.error.message : 'The execution could not run.';
          res.dataset.status = 'error';
        }
      });
      if (!ended) state.textContent = 'The stream ended before the result; see the executions below.';
    } catch (e) {
      if (!page.ctx.signal.aborted) state.textContent = e.name === 'AbortError' ? 'Stopped watching.' : e.message;
    } finally {
      run.disabled = false; cancel.hidden = true; ac = null;
      if (!page.ctx.signal.aborted) page.afterRun();
    }
  }},
  h('label', {for: 'run-code'}, 'Code'), code,
  h('div', {class: 'row'},
    h('label', {for: 'run-language'}, 'Language'), lang,
    h('label', {for: 'run-timeout'}, 'Timeout (s)'), timeout, run, cancel));
  return {el: h('section', {id: 'run', 'aria-labelledby': 'run-h'}, h('h2', {id: 'run-h'}, 'Run code'), form, state, out, res)};
}

export function executionsSection(page) {
  const {ctx, sid} = page;
  const body = h('tbody', {id: 'executions-body'});
  const detail = h('div', {id: 'execution-detail'});
  const show = async (id) => {
    replace(detail, h('p', {class: 'muted'}, 'Loading…'));
    try {
      const x = await call('GET', `/api/v1/executions/${encodeURIComponent(id)}/result`, {signal: ctx.signal});
      replace(detail, h('h3', null, h('code', null, id)), timeEl(x.created_at), result(x, true));
    } catch (e) { replace(detail, h('p', {class: 'error'}, e.message)); }
  };
  const refresh = async () => {
    try {
      const list = await call('GET', `/api/v1/sessions/${sid}/executions${q({limit: 20})}`, {signal: ctx.signal});
      replace(body, list.executions.length ? list.executions.map((x) => h('tr', null,
        h('th', {scope: 'row'}, h('button', {type: 'button', class: 'link mono', title: x.execution_id, 'aria-label': x.execution_id, dataset: {execution: x.execution_id}, onclick: () => show(x.execution_id)},
          x.execution_id.length > 16 ? `${x.execution_id.slice(0, 15)}…` : x.execution_id)),
        h('td', null, badge(x.status)),
        h('td', null, x.language),
        h('td', null, timeEl(x.created_at)),
        h('td', null, ms(x.duration_ms)))) : h('tr', null, h('td', {colspan: 5, class: 'muted'}, 'No executions yet.')));
    } catch (e) {
      if (!ctx.signal.aborted) replace(body, h('tr', null, h('td', {colspan: 5, class: 'error'}, e.message)));
    }
  };
  refresh();
  return {refresh, el: h('section', {id: 'executions', 'aria-labelledby': 'executions-h'},
    h('div', {class: 'row spread'}, h('h2', {id: 'executions-h'}, 'Executions'),
      h('button', {type: 'button', onclick: refresh}, 'Refresh')),
    h('div', {class: 'scroll'}, h('table', null,
      h('thead', null, h('tr', null, ['Execution', 'Status', 'Language', 'Created', 'Duration'].map((c) => h('th', {scope: 'col'}, c)))),
      body)),
    detail)};
}
