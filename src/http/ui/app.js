// The approval inbox: sign-in, the shell (navigation, connection state),
// what the token may do (GET /v1/me: a read-only token gets no decide
// buttons), the tenant-wide event stream shared by every view, the clock
// that refreshes countdowns every second, and hash routing:
//   #/inbox (default)   pending approvals of the tenant (the review desk)
//   #/history           the tenant's decision history
//   #/s/<session id>    one session: transcript, calls, tree, actions
//   #/new               start a session
// Plain ES modules, no framework and no build step: the files are served
// from the binary as they are written.

import { api, onUnauthorized, EventStream } from './api.js';
import { takeTokenFromFragment, getToken, setToken, clearToken, claims } from './auth.js';
import { h, clear, setText, announce, formatTime, isSessionId } from './dom.js';
import { tick } from './desk.js';
import { InboxStore, renderInbox } from './inbox.js';
import { renderHistory } from './history.js';
import { renderSession } from './session.js';
import { renderCreate } from './create.js';

const main = document.getElementById('main');
const top = document.getElementById('top');

let feed = null;
let store = null;
let view = null;
let expiryTimer = null;
let may = {};
const feedListeners = new Set();

/** What views get: the inbox store, what the token may do, the tenant
 *  feed, navigation. */
const ctx = {
  get store() { return store; },
  get may() { return may; },
  onFeed(listener) {
    feedListeners.add(listener);
    return () => feedListeners.delete(listener);
  },
  navigate(hash) {
    if (window.location.hash === hash) route();
    else window.location.hash = hash;
  },
  /** The view's part of the document title (the pending count is kept). */
  setTitle(title) {
    viewTitle = title;
    showTitle();
  },
};

// The title is the view's, prefixed with the pending count: the count
// changes with every event, and must not take a session's title away.
const APP_TITLE = 'overseer approvals';
let viewTitle = APP_TITLE;
let pendingCount = 0;

function showTitle() {
  document.title = pendingCount > 0 ? `(${pendingCount}) ${viewTitle}` : viewTitle;
}

function stopSession() {
  if (view) view.destroy?.();
  view = null;
  if (feed) feed.close();
  feed = null;
  store = null;
  may = {};
  pendingCount = 0;
  feedListeners.clear();
  clearTimeout(expiryTimer);
}

/** Back to sign-in, with `message` saying why. */
function signOut(message) {
  stopSession();
  clearToken();
  showSignIn(message);
}

function showSignIn(message) {
  top.hidden = true;
  document.title = 'Sign in · overseer approvals';
  const errorId = 'signin-error';
  const helpId = 'token-help';
  const textarea = h('textarea', {
    id: 'token', name: 'token', class: 'token', autocomplete: 'off', spellcheck: 'false',
    'aria-describedby': `${helpId} ${errorId}`, required: true,
  });
  const error = h('p', { id: errorId, class: 'error', role: 'alert', text: message || '' });
  const button = h('button', { type: 'submit', class: 'primary', id: 'sign-in' }, 'Sign in');
  const form = h('form', { class: 'signin', 'aria-labelledby': 'signin-title', novalidate: true },
    h('h1', { id: 'signin-title' }, 'Sign in to the approval inbox'),
    error,
    h('label', { for: 'token' }, 'Bearer token'),
    textarea,
    h('p', { id: helpId, class: 'hint' },
      'Paste a token (', h('kbd', {}, 'overseer token'), '), or open the link that ',
      h('kbd', {}, 'overseer token --url'), ' prints. It is kept in this tab only.'),
    h('div', { class: 'form-actions' }, button));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const token = textarea.value.trim();
    if (!token) {
      error.textContent = 'Paste a token first.';
      textarea.setAttribute('aria-invalid', 'true');
      textarea.focus();
      return;
    }
    button.disabled = true;
    setToken(token);
    await startSignedIn();
  });
  clear(main).append(form);
  if (message) announce(message);
  textarea.focus();
}

async function startSignedIn() {
  // One request proves the token and says what it may do before anything
  // is shown; a 401 comes back here through the unauthorized handler with
  // the server's reason.
  let me;
  try {
    me = await api('GET', '/v1/me');
  } catch (e) {
    if (e.status === 401) return;
    showSignIn(`The server could not be asked (${e.message}). Try again.`);
    return;
  }
  if (!me.may || !me.may.read) {
    clearToken();
    showSignIn('This token cannot be used here: it lacks sessions:read. The inbox needs sessions:read (and approvals:write to decide).');
    return;
  }
  const c = claims(getToken());
  if (!armExpiry(c.exp)) return;
  may = me.may;
  setText(document.getElementById('whoami'),
    [me.sub, me.tenant].filter(Boolean).join(' @ ') + (may.decide ? '' : ' (read-only)'));
  document.getElementById('nav-new').hidden = !may.write;
  top.hidden = false;
  store = new InboxStore(updateCount);
  feed = new EventStream('/v1/events', {
    event(type, data) {
      store.apply(type, data);
      for (const listener of feedListeners) listener(type, data);
    },
    state: setLive,
  });
  route();
}

/** Signs out when the token expires; false (signed out) if it already has. */
function armExpiry(exp) {
  clearTimeout(expiryTimer);
  if (typeof exp !== 'number') return true;
  const ms = exp * 1000 - Date.now();
  const message = `Your token expired at ${formatTime(exp * 1000)}. Sign in with a new one.`;
  // Already past (a slow sign-in, a sleeping laptop): no request may come to
  // be refused (the event stream outlives its token), so say so now.
  if (ms <= 0) {
    signOut(message);
    return false;
  }
  // setTimeout's delay is a 32-bit number; a longer lifetime re-arms.
  expiryTimer = setTimeout(() => (ms > 2 ** 31 - 1 ? armExpiry(exp) : signOut(message)),
    Math.min(ms, 2 ** 31 - 1));
  return true;
}

function setLive(state) {
  const el = document.getElementById('live');
  el.textContent = state === 'live' ? 'Live' : 'Reconnecting…';
  el.classList.toggle('reconnecting', state !== 'live');
}

function updateCount(n) {
  const badge = document.getElementById('inbox-count');
  badge.textContent = String(n);
  badge.setAttribute('aria-label', `${n} pending`);
  pendingCount = n;
  showTitle();
}

function route() {
  if (!getToken() || !store) return;
  if (view) view.destroy?.();
  view = null;
  clear(main);
  viewTitle = APP_TITLE;
  showTitle();
  const hash = window.location.hash || '#/inbox';
  const session = hash.match(/^#\/s\/([^/]+)$/);
  for (const a of document.querySelectorAll('.top nav a')) a.removeAttribute('aria-current');
  if (session && isSessionId(session[1])) {
    view = renderSession(main, session[1].toLowerCase(), ctx);
  } else if (hash === '#/new') {
    document.getElementById('nav-new').setAttribute('aria-current', 'page');
    view = renderCreate(main, ctx);
  } else if (hash === '#/history') {
    document.getElementById('nav-history').setAttribute('aria-current', 'page');
    view = renderHistory(main, ctx);
  } else {
    document.getElementById('nav-inbox').setAttribute('aria-current', 'page');
    view = renderInbox(main, ctx);
  }
}

function boot() {
  takeTokenFromFragment();
  onUnauthorized((reason) => {
    signOut(`The server refused your token (${reason}). Sign in again with a valid token.`);
  });
  document.getElementById('sign-out').addEventListener('click', () => signOut('Signed out.'));
  window.addEventListener('hashchange', () => {
    // A token handed over while the page is open.
    if (takeTokenFromFragment()) {
      stopSession();
      startSignedIn();
      return;
    }
    route();
  });
  // Countdowns to automatic denials say the truth to the second.
  setInterval(() => tick(), 1000);
  if (getToken()) startSignedIn();
  else showSignIn('');
}

boot();
