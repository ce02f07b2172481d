// DOM helpers. Every string that came from the server (model text, tool
// names, arguments, results, titles, reasons) becomes a text node or an
// attribute value set through the DOM, never markup: nothing here parses
// HTML, so a transcript containing <script> or <img onerror> is inert text.
// Every such string is shown through the one rendering rule (render.js):
// hidden and direction-changing characters appear as ⟨U+XXXX⟩. Form values
// are the exception: what a person edits is sent back, so it stays exact.

import { display, warningLine } from './render.js';

/** Creates an element. `props`: class, text, dataset, on<Event> (functions),
 *  and attributes (set with setAttribute; booleans add or omit them). Text
 *  and attribute values are shown through the rendering rule; `value` (a
 *  form field's content) and `dataset` (the page's own keys) are kept
 *  exact. */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = display(value);
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === 'value') el.value = value;
    else if (key === 'checked') el.checked = Boolean(value);
    else el.setAttribute(key, value === true ? '' : display(value));
  }
  append(el, children);
  return el;
}

/** Appends children: nodes as they are, strings and numbers as text shown
 *  through the rendering rule. */
export function append(el, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(display(child)));
  }
  return el;
}

/** Sets the text of `el`, shown through the rendering rule. */
export function setText(el, text) {
  el.textContent = display(text);
  return el;
}

/** The warnings of an approval (the API's `warnings`) as one visible
 *  warning block, or null when there are none. */
export function warningsBlock(warnings) {
  if (!Array.isArray(warnings) || !warnings.length) return null;
  return h('div', { class: 'warn text-warnings', role: 'note' },
    h('p', {}, 'Careful: what the model sent contains text that may not be what it seems.'),
    h('ul', {}, warnings.map((w) => h('li', { dataset: { code: String(w.code) } }, warningLine(w)))));
}

/** Removes every child of `el`. */
export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

let uid = 0;
/** A document-unique id for label/aria wiring. */
export function nextId(prefix) {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** Says `message` to screen readers (the polite live region). */
export function announce(message) {
  const region = document.getElementById('announce');
  if (!region) return;
  region.textContent = '';
  // A separate task, so that the same message twice is announced twice.
  setTimeout(() => { region.textContent = message; }, 30);
}

/** Pretty JSON. */
export function pretty(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** A local date and time. */
export function formatTime(ms) {
  return new Date(ms).toLocaleString();
}

/** "3 min", "2 h 5 min", "4 d": a duration in words. */
export function formatDuration(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours < 48) return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} d`;
}

/** A <time> element showing a relative time, refreshed by `tickTimes`. */
export function relativeTime(ms, kind) {
  const el = h('time', { datetime: new Date(ms).toISOString(), title: formatTime(ms), dataset: { at: String(ms), kind } });
  renderRelative(el);
  return el;
}

function renderRelative(el) {
  const at = Number(el.dataset.at);
  const now = Date.now();
  el.textContent = el.dataset.kind === 'until'
    ? (at > now ? `in ${formatDuration(at - now)}` : 'now')
    : formatDuration(now - at);
}

/** Re-renders every relative time under `root` (a local clock tick; the
 *  server is not asked anything). */
export function tickTimes(root = document) {
  for (const el of root.querySelectorAll('time[data-at]')) renderRelative(el);
}

/** The first 8 characters of an id, for display. */
export function shortId(id) {
  return String(id).slice(0, 8);
}

/** Whether a keyboard event happens while the user types somewhere. */
export function isTyping(event) {
  const t = event.target;
  if (!(t instanceof Element)) return false;
  return t.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(t.tagName);
}

/** A session id as the API writes them (UUID), so that ids put into links
 *  are ids and nothing else. */
export function isSessionId(value) {
  return /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(String(value));
}
