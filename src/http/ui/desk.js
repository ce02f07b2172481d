// The review desk's helpers, shared by the inbox, the history and the
// session view: session labels that tell sessions apart, the search and
// filters over cards, grouping and ordering, live countdowns with the
// "close to its automatic denial" mark, long texts that collapse with
// "Show all", and the argument diff of an edit (before it is confirmed and
// as recorded). Every element is made with dom.js's h(): strings stay text.

import { h, append, clear, pretty, formatDuration } from './dom.js';

// ---- labels -----------------------------------------------------------------

/** A short, distinguishing form of a session id. Ids are UUIDv7: their
 *  first characters are the creation time (sessions of the same minute
 *  share them), their last ones are random, so those tell sessions apart. */
export function shortLabel(id) {
  return String(id).replace(/-/g, '').slice(-8);
}

/** How a session is named on the page: its title, or "Session …" with the
 *  distinguishing part of its id. */
export function sessionName(title, id) {
  return title || `Session …${shortLabel(id)}`;
}

// ---- search, filters, order, groups -------------------------------------------

const haystacks = new WeakMap();

/** What the search box looks in: session title, agent, tool and the text of
 *  the arguments (lower-cased once per card). */
function haystack(item) {
  let text = haystacks.get(item);
  if (text === undefined) {
    let args = '';
    try {
      args = JSON.stringify(item.arguments);
    } catch {
      args = '';
    }
    text = [item.title || '', sessionName(item.title, item.root_session_id), item.agent, item.name, args]
      .join('\n').toLowerCase();
    haystacks.set(item, text);
  }
  return text;
}

/** Whether `item` passes `view`'s filters: {agent, tool, search}. Every
 *  word of the search must occur somewhere in the card's text. */
export function matches(item, view) {
  if (view.agent && item.agent !== view.agent) return false;
  if (view.tool && item.name !== view.tool) return false;
  const words = (view.search || '').toLowerCase().split(/\s+/).filter(Boolean);
  if (!words.length) return true;
  const text = haystack(item);
  return words.every((w) => text.includes(w));
}

const NO_DEADLINE = Number.MAX_SAFE_INTEGER;

/** Orders cards: `newest` (the newest request first) or `deadline` (the
 *  soonest automatic denial first). Ties by call id, for a stable order. */
export function compare(order) {
  const byId = (a, b) => (a.call_id < b.call_id ? 1 : a.call_id > b.call_id ? -1 : 0);
  if (order === 'deadline') {
    return (a, b) => (a.approval_deadline_ms ?? NO_DEADLINE) - (b.approval_deadline_ms ?? NO_DEADLINE)
      || b.requested_at_ms - a.requested_at_ms || byId(a, b);
  }
  return (a, b) => b.requested_at_ms - a.requested_at_ms || byId(a, b);
}

/** Groups sorted cards by the session a person started (the root), in the
 *  order of each group's first card: [{key, items}]. */
export function groupBySession(items) {
  const groups = new Map();
  for (const item of items) {
    const key = item.root_session_id;
    if (!groups.has(key)) groups.set(key, { key, items: [] });
    groups.get(key).items.push(item);
  }
  return [...groups.values()];
}

/** The distinct values of `field` over `items`, sorted. */
export function distinct(items, field) {
  return [...new Set(items.map((i) => i[field]).filter(Boolean))].sort();
}

// ---- time ----------------------------------------------------------------------

/** Whether a call is close to its automatic denial: less than a tenth of
 *  its waiting time, and at most five minutes, are left (at least the last
 *  minute is). */
export function dueSoon(item, now = Date.now()) {
  const deadline = item.approval_deadline_ms;
  if (!deadline) return false;
  const left = deadline - now;
  const span = deadline - item.requested_at_ms;
  return left <= Math.max(60_000, Math.min(300_000, span / 10));
}

/** A live countdown to `ms` ('until') or time since `ms` ('since'): text
 *  refreshed by `tick`. */
export function countdown(ms, kind, { inCard = false } = {}) {
  const el = h('time', { class: inCard ? 'clock in-card' : 'clock', datetime: new Date(ms).toISOString(), title: new Date(ms).toLocaleString(), dataset: { at: String(ms), kind } });
  renderClock(el, Date.now());
  return el;
}

function clockText(el, now) {
  const at = Number(el.dataset.at);
  if (el.dataset.kind === 'until') return at > now ? `in ${formatDuration(at - now)}` : 'now';
  return formatDuration(now - at);
}

function renderClock(el, now) {
  const text = clockText(el, now);
  // Written only when it changes: a thousand cards tick every second.
  if (el.textContent !== text) el.textContent = text;
}

/** Refreshes the countdowns under `root` and, when it is a card with a
 *  deadline (`data-deadline`), its due-soon mark. */
function refresh(root, now) {
  for (const el of root.querySelectorAll('time.clock')) renderClock(el, now);
  if (!root.dataset.deadline) return;
  const soon = dueSoon({ approval_deadline_ms: Number(root.dataset.deadline), requested_at_ms: Number(root.dataset.requested) }, now);
  if (root.classList.contains('due-soon') !== soon) {
    root.classList.toggle('due-soon', soon);
    const mark = root.querySelector('.due-mark');
    if (mark) mark.hidden = !soon;
  }
}

// Only what is on screen (or about to be) ticks: a thousand cards whose
// texts all change every second would be laid out again every second. A
// card that scrolls into view is brought up to date at once.
const onScreen = new Set();
let observer = null;

/** Makes the clocks of `el` (a card) tick while it is on screen. */
export function watchClocks(el) {
  if (typeof IntersectionObserver !== 'function') {
    onScreen.add(el);
    return;
  }
  observer = observer || new IntersectionObserver((entries) => {
    const now = Date.now();
    for (const e of entries) {
      if (e.isIntersecting) {
        onScreen.add(e.target);
        refresh(e.target, now);
      } else {
        onScreen.delete(e.target);
      }
    }
  }, { rootMargin: '200px 0px' });
  observer.observe(el);
}

/** Stops watching `el` (a card gone for good). */
export function unwatchClocks(el) {
  observer?.unobserve(el);
  onScreen.delete(el);
}

/** One tick of the clock: the countdowns and due-soon marks of the cards
 *  on screen, and every clock outside a card, from the local clock
 *  (nothing is asked of the server). */
export function tick() {
  const now = Date.now();
  for (const el of onScreen) {
    if (el.isConnected) refresh(el, now);
  }
  for (const el of document.querySelectorAll('time.clock:not(.in-card)')) renderClock(el, now);
}

// ---- long texts ----------------------------------------------------------------

/** Characters shown of a long text before "Show all". */
export const COLLAPSED_CHARS = 600;
/** Lines shown of a long text before "Show all". */
const COLLAPSED_LINES = 12;

function shortened(text) {
  let end = Math.min(text.length, COLLAPSED_CHARS);
  let lines = 0;
  for (let i = 0; i < end; i += 1) {
    if (text.charCodeAt(i) === 10) {
      lines += 1;
      if (lines >= COLLAPSED_LINES) {
        end = i;
        break;
      }
    }
  }
  return end < text.length ? text.slice(0, end) : null;
}

function sizeOf(text) {
  const n = text.length;
  return n >= 1024 ? `${Math.round(n / 1024)} K characters` : `${n} characters`;
}

/** `text` in a `tag` element (`p` or `pre`), collapsed to its beginning
 *  when long, with a "Show all" / "Show less" toggle. Only the shown part
 *  is in the document. `note` (optional) follows the whole text, e.g. that
 *  the server cut it. */
export function longText(tag, text, props = {}, note = null) {
  const value = String(text ?? '');
  const head = shortened(value);
  const body = h(tag, props, head === null ? value : `${head}…`);
  if (head === null && !note) return body;
  const extra = note ? h('p', { class: 'hint', hidden: head !== null }, note) : null;
  if (head === null) return h('div', { class: 'long' }, body, extra);
  const toggle = h('button', { type: 'button', class: 'show-all', 'aria-expanded': 'false' }, `Show all (${sizeOf(value)})`);
  toggle.addEventListener('click', () => {
    const open = toggle.getAttribute('aria-expanded') !== 'true';
    append(clear(body), open ? value : `${head}…`);
    toggle.setAttribute('aria-expanded', String(open));
    toggle.textContent = open ? 'Show less' : `Show all (${sizeOf(value)})`;
    if (extra) extra.hidden = !open;
  });
  return h('div', { class: 'long' }, body, toggle, extra);
}

/** Pretty JSON of `value` as a collapsible block. */
export function longJson(value, props = {}) {
  return longText('pre', pretty(value), props);
}

// ---- argument diffs ----------------------------------------------------------------

/** What an edit changes: the `override_args` (keys added or changed) and
 *  `remove_args` (proposed keys left out) that turn `proposed` into
 *  `edited`, and the diff in the recorded shape
 *  (`{key: {from, to}}`, `{key: {from, removed: true}}`). */
export function editOf(proposed, edited) {
  const base = proposed && typeof proposed === 'object' && !Array.isArray(proposed) ? proposed : {};
  const override = {};
  const remove = [];
  const diff = {};
  for (const [key, value] of Object.entries(edited)) {
    const same = Object.prototype.hasOwnProperty.call(base, key) && JSON.stringify(base[key]) === JSON.stringify(value);
    if (!same) {
      override[key] = value;
      diff[key] = { from: Object.prototype.hasOwnProperty.call(base, key) ? base[key] : null, to: value };
    }
  }
  for (const key of Object.keys(base)) {
    if (!Object.prototype.hasOwnProperty.call(edited, key)) {
      remove.push(key);
      diff[key] = { from: base[key], removed: true };
    }
  }
  return { override, remove, diff };
}

function short(value) {
  const text = JSON.stringify(value);
  return text === undefined ? 'undefined' : text;
}

/** A recorded (or previewed) argument diff as a list, or null when empty. */
export function diffList(diff, label = 'Edited arguments') {
  const entries = diff && typeof diff === 'object' ? Object.entries(diff) : [];
  if (!entries.length) return null;
  return h('ul', { class: 'diff', 'aria-label': label },
    entries.map(([key, change]) => h('li', { class: change && change.removed ? 'removed' : 'changed' },
      h('code', {}, key), ': ',
      change && change.removed
        ? [h('code', {}, short(change.from)), ' → ', h('em', {}, 'removed')]
        : [h('code', {}, short(change ? change.from : null)), ' → ', h('code', {}, short(change ? change.to : null))])));
}
