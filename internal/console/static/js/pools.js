// Warm pools: the sbx_pool_ready gauge of the Prometheus endpoint, per
// template. /metrics needs no credential only without API keys (with
// keys it is the operator's, read with the metrics token, and a tenant's
// key is refused), and may be out of reach (a proxy that serves only
// /api); the page then says so.
import {h, replace} from './dom.js';
import {request} from './api.js';

// poolReady reads sbx_pool_ready{template="NAME"} N lines of Prometheus
// text into [[name, n], ...].
export function poolReady(text) {
  const out = [];
  for (const line of text.split('\n')) {
    const m = /^sbx_pool_ready\{(?:[^}]*,)?template="((?:[^"\\]|\\.)*)"[^}]*\}\s+(\S+)/.exec(line);
    if (m) out.push([m[1].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c)), Number(m[2])]);
  }
  return out.sort((a, b) => a[0].localeCompare(b[0]));
}

export async function poolsView(ctx) {
  ctx.title('Pools');
  const box = h('div', {id: 'pools-body'});
  replace(ctx.main, h('h1', null, 'Warm pools'),
    h('p', {class: 'muted'}, 'Sandboxes started ahead of demand (sbx serve --pool TEMPLATE=SIZE), ready for new sessions of their template. Server-wide, from /metrics.'),
    box);
  const load = async () => {
    let text;
    try {
      text = await (await request('GET', '/metrics', {signal: ctx.signal, key: ''})).text();
    } catch (e) {
      if (!ctx.signal.aborted) replace(box, h('p', {class: 'muted'}, `/metrics is not reachable: ${e.message}`));
      return;
    }
    const pools = poolReady(text);
    replace(box, pools.length ? h('table', {id: 'pools'},
      h('thead', null, h('tr', null, h('th', {scope: 'col'}, 'Template'), h('th', {scope: 'col'}, 'Ready'))),
      h('tbody', null, pools.map(([t, n]) => h('tr', null, h('th', {scope: 'row'}, t), h('td', null, String(n))))))
      : h('p', {class: 'muted'}, 'No warm pools on this server.'));
  };
  await load();
  ctx.every(5000, load);
}
