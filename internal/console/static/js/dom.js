// DOM building from data. Every string becomes a text node or an
// attribute value, never markup: file names, outputs and errors come from
// sandboxed code and are shown as the characters they are. (The page's
// Content-Security-Policy enforces Trusted Types with no policy, so an
// HTML string sink would throw rather than render.)

function setProps(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k === 'value') el.value = v;
    else el.setAttribute(k === 'className' ? 'class' : k, v === true ? '' : String(v));
  }
}

function add(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) add(el, c);
    else if (c instanceof Node) el.append(c);
    else el.append(document.createTextNode(String(c)));
  }
  return el;
}

// h('tag', {attr: value, onclick: fn}, ...children)
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  return add(el, children);
}

const SVG = 'http://www.w3.org/2000/svg';

export function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG, tag);
  setProps(el, props);
  return add(el, children);
}

export function replace(el, ...children) {
  el.replaceChildren();
  return add(el, children);
}

export function $(sel, root = document) { return root.querySelector(sel); }

// confirm asks in the page's own dialog (keyboard: Esc cancels, the
// focus starts on Cancel) and resolves to true for OK.
export function confirm(text, ok = 'OK') {
  const d = $('#confirm');
  $('#confirm-text').textContent = text;
  $('#confirm-ok').textContent = ok;
  return new Promise((resolve) => {
    const done = (v) => () => { d.close(); resolve(v); };
    const yes = done(true), no = done(false);
    $('#confirm-ok').addEventListener('click', yes, {once: true});
    $('#confirm-cancel').addEventListener('click', no, {once: true});
    d.addEventListener('cancel', no, {once: true});
    d.addEventListener('close', () => {
      $('#confirm-ok').removeEventListener('click', yes);
      $('#confirm-cancel').removeEventListener('click', no);
      d.removeEventListener('cancel', no);
    }, {once: true});
    d.showModal();
    $('#confirm-cancel').focus();
  });
}

// Formatting.

export function bytes(n) {
  if (n === null || n === undefined) return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(n < 10 ? 1 : 0) : n} ${u[i]}`;
}

export function time(s) {
  if (!s) return '—';
  const d = new Date(s);
  return isNaN(d) ? String(s) : d.toLocaleString();
}

export function timeEl(s) {
  return h('time', {datetime: s || null, title: s || null}, time(s));
}

// span is a duration in seconds, as "3d 4h", "2h 5m", "4m 12s", "9s".
export function span(sec) {
  sec = Math.max(0, Math.round(sec));
  const d = Math.floor(sec / 86400), hr = Math.floor(sec / 3600) % 24;
  const m = Math.floor(sec / 60) % 60, s = sec % 60;
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

export function ms(n) {
  if (n === null || n === undefined) return '—';
  return n < 1000 ? `${n} ms` : `${(n / 1000).toFixed(n < 10000 ? 2 : 1)} s`;
}

// countdown is an element that counts down to a time: tick() (called
// every second by the page) keeps its text current.
export function countdown(at, label) {
  return h('span', {class: 'countdown', dataset: {at: String(at), label}}, countText(at, label));
}

function countText(at, label) {
  const left = (at - Date.now()) / 1000;
  return left > 0 ? `${label} in ${span(left)}` : `${label} due`;
}

export function tick(root = document) {
  for (const el of root.querySelectorAll('.countdown')) {
    el.textContent = countText(Number(el.dataset.at), el.dataset.label);
  }
}

export function badge(status) {
  return h('span', {class: `badge s-${String(status).replace(/[^a-z_]/g, '')}`}, status);
}

// pathURL escapes each segment of a workspace path, keeping the slashes.
export function pathURL(p) {
  return p.split('/').map(encodeURIComponent).join('/');
}

// save offers a blob as a download under name.
export function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h('a', {href: url, download: name, hidden: true});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
}
