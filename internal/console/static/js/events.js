// A session's lifecycle events: GET /api/v1/sessions/{id}/events,
// oldest first, a page at a time ({events, next_after}); each event's
// number, time, type and data (statuses, ids and reasons, never code or
// output), shown as text.
import {h, replace, timeEl} from './dom.js';
import {call, q} from './api.js';

// maxPages bounds what the timeline reads at once (1000 events a page).
const maxPages = 10;

export function eventRows(events) {
  return events.map((e) => h('tr', null,
    h('td', null, String(e.id)),
    h('td', null, timeEl(e.created_at)),
    h('th', {scope: 'row'}, h('code', null, e.type)),
    h('td', null, e.data && Object.keys(e.data).length ? h('code', {class: 'data'}, JSON.stringify(e.data)) : '')));
}

export function eventsSection(page) {
  const {ctx, sid} = page;
  const box = h('div', {id: 'events-body'});
  const load = async () => {
    try {
      const events = [];
      let after = 0;
      for (let i = 0; i < maxPages; i++) {
        const got = await call('GET', `/api/v1/sessions/${sid}/events${q({after, limit: 1000})}`, {signal: ctx.signal});
        events.push(...got.events);
        if (got.events.length < 1000) break;
        after = got.next_after;
      }
      replace(box, events.length ? h('div', {class: 'scroll'}, h('table', null,
        h('thead', null, h('tr', null, ['#', 'Time', 'Event', 'Data'].map((c) => h('th', {scope: 'col'}, c)))),
        h('tbody', null, eventRows(events)))) : h('p', {class: 'muted'}, 'No events.'));
      box.dataset.state = 'shown';
    } catch (e) {
      if (ctx.signal.aborted) return;
      replace(box, h('p', {class: 'error'}, e.message));
      box.dataset.state = 'error';
    }
  };
  load();
  return h('section', {id: 'events', 'aria-labelledby': 'events-h'},
    h('div', {class: 'row spread'}, h('h2', {id: 'events-h'}, 'Events'), h('button', {type: 'button', onclick: load}, 'Refresh')),
    box);
}
