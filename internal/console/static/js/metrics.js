// A session's sandbox's CPU, memory and disk over the last minutes, as
// small SVG line charts drawn here (no chart library).
import {h, svg, replace, bytes} from './dom.js';
import {call} from './api.js';

const W = 320, H = 110, PAD = 4;

// chart draws points [{t: ms, v: number}] against 0..max, with its title,
// the last value and the range of times as text beside it.
export function chart(title, points, max, fmt, showMax = true) {
  const last = points.length ? points[points.length - 1].v : null;
  const fig = h('figure', {class: 'chart'});
  const cap = h('figcaption', null, h('strong', null, title), ' ', last === null ? '—' : fmt(last), max && showMax ? h('span', {class: 'muted'}, ` of ${fmt(max)}`) : null);
  if (points.length < 2) {
    fig.append(cap, h('p', {class: 'muted'}, 'Not enough samples yet.'));
    return fig;
  }
  const t0 = points[0].t, t1 = points[points.length - 1].t;
  const top = max || Math.max(...points.map((p) => p.v)) * 1.1 || 1;
  const x = (t) => PAD + (W - 2 * PAD) * (t - t0) / Math.max(1, t1 - t0);
  const y = (v) => H - PAD - (H - 2 * PAD) * Math.min(1, v / top);
  const line = points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
  const grid = [0.25, 0.5, 0.75].map((f) => svg('line', {x1: PAD, x2: W - PAD, y1: y(top * f), y2: y(top * f), class: 'grid'}));
  const label = `${title}: from ${new Date(t0).toLocaleTimeString()} to ${new Date(t1).toLocaleTimeString()}, last ${fmt(last)}, highest ${fmt(Math.max(...points.map((p) => p.v)))}`;
  fig.append(cap,
    svg('svg', {viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label, preserveAspectRatio: 'none'},
      svg('rect', {x: 0, y: 0, width: W, height: H, class: 'frame'}), grid,
      svg('polyline', {points: `${x(t0)},${H - PAD} ${line} ${x(t1)},${H - PAD}`, class: 'area'}),
      svg('polyline', {points: line, class: 'line'})),
    h('div', {class: 'axis muted'}, h('span', null, new Date(t0).toLocaleTimeString()), h('span', null, new Date(t1).toLocaleTimeString())));
  return fig;
}

export function metricsSection(page) {
  const {ctx, sid} = page;
  const box = h('div', {id: 'metrics-charts', class: 'charts'});
  const load = async () => {
    let m;
    try {
      m = await call('GET', `/api/v1/sessions/${sid}/metrics`, {signal: ctx.signal});
    } catch (e) {
      if (!ctx.signal.aborted) replace(box, h('p', {class: 'error'}, e.message));
      return;
    }
    const samples = m.samples.slice();
    if (m.current && (!samples.length || samples[samples.length - 1].timestamp !== m.current.timestamp)) samples.push(m.current);
    if (!samples.length) {
      replace(box, h('p', {class: 'muted'}, `No readings: the sandbox is ${m.sandbox} (metrics come while a sandbox is running or paused).`));
      return;
    }
    const pts = (f) => samples.filter((s) => f(s) !== undefined).map((s) => ({t: Date.parse(s.timestamp), v: f(s)}));
    const cur = samples[samples.length - 1];
    replace(box,
      chart('CPU', pts((s) => s.cpu_used_pct), 100, (v) => `${v.toFixed(1)}%`, false),
      chart('Memory', pts((s) => s.memory_used_bytes), cur.memory_limit_bytes, bytes),
      cur.disk_used_bytes !== undefined ? chart('Disk', pts((s) => s.disk_used_bytes), cur.disk_limit_bytes, bytes) : null,
      h('p', {class: 'muted'}, `${cur.pids} of ${cur.pids_limit} processes · ${cur.cpu_count} CPU · sampled every ${m.interval_seconds} s`));
  };
  load();
  ctx.every(5000, load);
  return h('section', {id: 'metrics', 'aria-labelledby': 'metrics-h'}, h('h2', {id: 'metrics-h'}, 'Metrics'), box);
}
