// A session's lifecycle events. The events API comes with another
// change; until a server has it, this section says so. Everything that
// knows the API's shape is in this file: the path, the page's field
// names, and how one event is shown (its type, time and whatever data it
// carries, rendered generically).
import {h, replace, timeEl} from './dom.js';
import {call, ApiError} from './api.js';

// eventRows turns a page of events into table rows, tolerating other
// shapes: an array, or {events|items: [...]}; each event's type, time
// and data under any of a few common names.
export function eventRows(page) {
  const list = Array.isArray(page) ? page : (page && (page.events || page.items)) || [];
  return list.map((e) => {
    const type = e.type || e.event || e.name || '?';
    const at = e.created_at || e.time || e.timestamp || e.at || '';
    const data = e.data !== undefined ? e.data : e.details;
    return h('tr', null,
      h('td', null, e.seq !== undefined ? String(e.seq) : ''),
      h('td', null, timeEl(at)),
      h('th', {scope: 'row'}, h('code', null, type)),
      h('td', null, data === undefined || data === null ? '' : h('code', {class: 'data'}, typeof data === 'string' ? data : JSON.stringify(data))));
  });
}

export function eventsSection(page) {
  const {ctx, sid} = page;
  const box = h('div', {id: 'events-body'});
  const load = async () => {
    try {
      const got = await call('GET', `/api/v1/sessions/${sid}/events`, {signal: ctx.signal});
      const rows = eventRows(got);
      replace(box, rows.length ? h('div', {class: 'scroll'}, h('table', null,
        h('thead', null, h('tr', null, ['#', 'Time', 'Event', 'Data'].map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', null, rows))) : h('p', {class: 'muted'}, 'No events.'));
      box.dataset.state = 'shown';
    } catch (e) {
      if (ctx.signal.aborted) return;
      if (e instanceof ApiError && (e.status === 404 || e.status === 405) && page.session.status) {
        // The session exists (the page shows it), so a 404 here is the
        // server's: it has no events API yet.
        replace(box, h('p', {class: 'muted'}, 'Lifecycle events are not available on this server.'));
        box.dataset.state = 'unavailable';
        return;
      }
      replace(box, h('p', {class: 'error'}, e.message));
      box.dataset.state = 'error';
    }
  };
  load();
  return h('section', {id: 'events', 'aria-labelledby': 'events-h'},
    h('div', {class: 'row spread'}, h('h2', {id: 'events-h'}, 'Events'), h('button', {type: 'button', onclick: load}, 'Refresh')),
    box);
}
