// The inbox: every pending approval of the tenant, kept live by the tenant
// event stream (a `reset` reloads the snapshot, GET /v1/approvals; later
// events add and remove cards), and the cards that decide them.

import { api, ApiError } from './api.js';
import { h, announce, pretty, relativeTime, shortId, nextId, isTyping, isSessionId, warningsBlock } from './dom.js';
import { escapedJson } from './render.js';

/** Most pending approvals loaded into the page (pages of 200). */
const MAX_LOADED = 1000;

/** Pending approvals by call id, newest request first. */
export class InboxStore {
  constructor(onCount) {
    this.items = new Map();
    this.listeners = new Set();
    this.onCount = onCount;
    this.loading = null;
    this.queued = [];
    this.truncated = false;
    this.loaded = false;
  }

  subscribe(listener) {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  sorted() {
    return [...this.items.values()].sort((a, b) =>
      b.requested_at_ms - a.requested_at_ms || (a.call_id < b.call_id ? 1 : a.call_id > b.call_id ? -1 : 0));
  }

  changed(added = []) {
    this.onCount(this.items.size);
    for (const listener of this.listeners) listener(added);
  }

  /** One event of the tenant stream. */
  apply(type, data) {
    if (type === 'reset') {
      this.reload();
      return;
    }
    if (this.loading) {
      // Applied on top of the snapshot being read.
      this.queued.push([type, data]);
      return;
    }
    const added = [];
    this.applyOne(type, data, added);
    this.changed(added);
  }

  applyOne(type, data, added) {
    switch (type) {
      case 'approval_requested':
        if (data.approval && data.approval.call_id) {
          if (!this.items.has(data.approval.call_id)) added.push(data.approval.call_id);
          this.items.set(data.approval.call_id, data.approval);
        } else if (data.approval_omitted) {
          this.reload();
        }
        break;
      case 'decision_recorded':
      case 'tool_call_finished':
        this.items.delete(data.call_id);
        break;
      case 'status_changed':
        // Only a session waiting for approval has pending calls.
        if (data.status !== 'awaiting_approval') {
          for (const [id, item] of this.items) {
            if (item.session_id === data.session_id) this.items.delete(id);
          }
        }
        break;
      default:
    }
  }

  /** Removes a call decided from this page (its events follow). */
  remove(callId) {
    if (this.items.delete(callId)) this.changed();
  }

  reload() {
    if (this.loading) {
      this.again = true;
      return this.loading;
    }
    this.queued = [];
    this.loading = (async () => {
      const items = new Map();
      let cursor = null;
      let truncated = false;
      try {
        do {
          const q = cursor ? `?limit=200&cursor=${encodeURIComponent(cursor)}` : '?limit=200';
          const page = await api('GET', `/v1/approvals${q}`);
          for (const item of page.approvals) items.set(item.call_id, item);
          cursor = page.next_cursor;
          if (cursor && items.size >= MAX_LOADED) {
            truncated = true;
            break;
          }
        } while (cursor);
      } catch (e) {
        this.loading = null;
        this.error = e;
        this.changed();
        return;
      }
      const before = new Set(this.items.keys());
      this.items = items;
      this.truncated = truncated;
      this.error = null;
      const queued = this.queued;
      this.queued = [];
      this.loading = null;
      const added = [];
      for (const [type, data] of queued) this.applyOne(type, data, added);
      this.loaded = true;
      for (const id of this.items.keys()) if (!before.has(id)) added.push(id);
      this.changed(added);
      if (this.again) {
        this.again = false;
        this.reload();
      }
    })();
    return this.loading;
  }
}

/** Sends decisions, one submission per owning session. Resolves with the
 *  per-session outcomes. */
async function submit(items, decisionOf) {
  const bySession = new Map();
  for (const item of items) {
    if (!bySession.has(item.session_id)) bySession.set(item.session_id, {});
    bySession.get(item.session_id)[item.call_id] = decisionOf(item);
  }
  return Promise.all([...bySession].map(async ([session, decisions]) => {
    try {
      await api('POST', `/v1/sessions/${session}/approvals`, { decisions });
      return { session, ok: true, calls: Object.keys(decisions) };
    } catch (error) {
      return { session, ok: false, error, calls: Object.keys(decisions) };
    }
  }));
}

function sessionLabel(item) {
  return item.title || `Session ${shortId(item.root_session_id)}`;
}

/** The card of one pending approval. `ctx.store` is told what was decided. */
export function approvalCard(item, ctx, { selectable = true, onSelect } = {}) {
  const titleId = nextId('card-title');
  const argsId = nextId('args');
  const argsError = `${argsId}-error`;
  const argsHelp = `${argsId}-help`;
  const reasonId = nextId('reason');
  const cardError = h('p', { class: 'error', role: 'alert' });
  const label = `${item.name} for ${sessionLabel(item)}`;

  const checkbox = selectable
    ? h('input', { type: 'checkbox', class: 'select', 'aria-label': `Select ${label}`, onChange: () => onSelect?.() })
    : null;

  const editor = h('textarea', {
    id: argsId, class: 'args-editor', spellcheck: 'false', autocomplete: 'off',
    // Hidden characters as JSON escapes: visible, and sent back exact.
    'aria-describedby': `${argsHelp} ${argsError}`, value: escapedJson(item.arguments),
  });
  const editorError = h('p', { id: argsError, class: 'field-error', role: 'alert' });
  const editForm = h('form', { class: 'edit', hidden: true, 'aria-label': `Edit arguments of ${label}` },
    h('label', { for: argsId }, 'Arguments (JSON)'),
    editor,
    h('p', { id: argsHelp, class: 'hint' },
      'Keys you change replace the proposed ones; keys you remove keep their proposed value. The server checks the result against the tool\'s schema.'),
    editorError,
    h('div', { class: 'form-actions' },
      h('button', { type: 'submit', class: 'approve' }, 'Approve with these arguments'),
      h('button', { type: 'button', onClick: () => closeForms(true) }, 'Cancel')));

  const reason = h('input', { id: reasonId, type: 'text', class: 'reason', autocomplete: 'off' });
  const denyForm = h('form', { class: 'deny-form', hidden: true, 'aria-label': `Deny ${label}` },
    h('label', { for: reasonId }, 'Reason (the model sees it)'),
    reason,
    h('div', { class: 'form-actions' },
      h('button', { type: 'submit', class: 'deny' }, 'Deny'),
      h('button', { type: 'button', onClick: () => closeForms(true) }, 'Cancel')));

  const approveButton = h('button', { type: 'button', class: 'approve', 'aria-label': `Approve ${label}` }, 'Approve');
  const editButton = h('button', { type: 'button', 'aria-label': `Edit arguments of ${label}`, 'aria-expanded': 'false' }, 'Edit arguments');
  const denyButton = h('button', { type: 'button', class: 'deny', 'aria-label': `Deny ${label}`, 'aria-expanded': 'false' }, 'Deny…');

  const path = item.path && item.path.length > 1
    ? h('p', { class: 'path' }, 'Subagent path: ',
      item.path.map((step, i) => [
        i ? ' › ' : '',
        isSessionId(step.session_id)
          ? h('a', { href: `#/s/${step.session_id}`, title: step.session_id }, step.agent)
          : step.agent,
      ]))
    : null;

  const card = h('article', {
    class: 'card', tabindex: '0', 'aria-labelledby': titleId, dataset: { call: item.call_id, session: item.session_id },
  },
  h('div', { class: 'card-head' }, checkbox,
    h('div', {},
      h('h2', { id: titleId }, h('span', { class: 'tool' }, item.name), ' ',
        h('span', { class: 'muted' }, `asked by ${item.agent}`)),
      h('p', {}, 'Session: ',
        isSessionId(item.root_session_id)
          ? h('a', { href: `#/s/${item.root_session_id}`, class: 'session-link' }, sessionLabel(item))
          : sessionLabel(item)))),
  path,
  warningsBlock(item.warnings),
  item.description ? h('p', { class: 'description' }, item.description) : null,
  h('pre', { class: 'arguments', 'aria-label': 'Arguments' }, pretty(item.arguments)),
  item.outcome_unknown
    ? h('p', { class: 'warn' }, 'This call was running when the server stopped; whether it took effect is unknown. Approving runs it again.')
    : null,
  h('p', { class: 'times' }, 'Waiting ', relativeTime(item.requested_at_ms, 'since'),
    item.approval_deadline_ms ? [' · denied automatically ', relativeTime(item.approval_deadline_ms, 'until')] : null),
  h('div', { class: 'actions' }, approveButton, editButton, denyButton),
  editForm, denyForm, cardError);

  function closeForms(focus) {
    editForm.hidden = true;
    denyForm.hidden = true;
    editButton.setAttribute('aria-expanded', 'false');
    denyButton.setAttribute('aria-expanded', 'false');
    if (focus) card.focus();
  }

  function busy(on) {
    for (const b of card.querySelectorAll('button')) b.disabled = on;
  }

  async function decide(decision) {
    cardError.textContent = '';
    busy(true);
    const [outcome] = await submit([item], () => decision);
    busy(false);
    if (outcome.ok) {
      announce(`${decision.decision === 'approve' ? 'Approved' : 'Denied'} ${item.name}.`);
      ctx.store?.remove(item.call_id);
      return true;
    }
    const e = outcome.error;
    if (e instanceof ApiError && (e.code === 'already_decided' || e.code === 'unknown_calls' || e.status === 404 || e.code === 'session_terminal')) {
      announce(`${item.name} was already decided elsewhere.`);
      ctx.store?.remove(item.call_id);
      return true;
    }
    if (e instanceof ApiError && e.code === 'invalid_override' && !editForm.hidden) {
      const detail = e.details && typeof e.details.error === 'object' ? e.details.error.error : null;
      editorError.textContent = detail || e.message;
      editor.setAttribute('aria-invalid', 'true');
      editor.focus();
      return false;
    }
    cardError.textContent = e.message;
    return false;
  }

  approveButton.addEventListener('click', () => decide({ decision: 'approve' }));
  editButton.addEventListener('click', () => {
    const open = editForm.hidden;
    closeForms(false);
    editForm.hidden = !open;
    editButton.setAttribute('aria-expanded', String(open));
    if (open) editor.focus();
  });
  denyButton.addEventListener('click', () => {
    const open = denyForm.hidden;
    closeForms(false);
    denyForm.hidden = !open;
    denyButton.setAttribute('aria-expanded', String(open));
    if (open) reason.focus();
  });
  editor.addEventListener('input', () => {
    editor.removeAttribute('aria-invalid');
    editorError.textContent = '';
  });
  editForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    let value;
    try {
      value = JSON.parse(editor.value);
    } catch (e) {
      editorError.textContent = `Not valid JSON: ${e.message}`;
      editor.setAttribute('aria-invalid', 'true');
      editor.focus();
      return;
    }
    if (!value || typeof value !== 'object' || Array.isArray(value)) {
      editorError.textContent = 'The arguments must be a JSON object.';
      editor.setAttribute('aria-invalid', 'true');
      editor.focus();
      return;
    }
    await decide({ decision: 'approve', override_args: value });
  });
  denyForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    const message = reason.value.trim();
    await decide(message ? { decision: 'deny', message } : { decision: 'deny' });
  });
  card.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && (!editForm.hidden || !denyForm.hidden)) {
      event.preventDefault();
      closeForms(true);
    }
  });

  card.actions = {
    approve: () => decide({ decision: 'approve' }),
    edit: () => editButton.click(),
    deny: () => denyButton.click(),
    toggle: () => {
      if (!checkbox) return;
      checkbox.checked = !checkbox.checked;
      onSelect?.();
    },
    selected: () => Boolean(checkbox && checkbox.checked),
    formOpen: () => !editForm.hidden || !denyForm.hidden,
  };
  return card;
}

const SHORTCUTS = [
  ['j / ↓', 'next approval'],
  ['k / ↑', 'previous approval'],
  ['x', 'select or unselect'],
  ['a', 'approve'],
  ['e', 'edit arguments, then approve'],
  ['d', 'deny with a reason'],
  ['o', 'open its session'],
  ['A', 'approve every selected'],
  ['D', 'deny every selected (reason field)'],
  ['?', 'show or hide these shortcuts'],
];

/** The inbox view. */
export function renderInbox(main, ctx) {
  const store = ctx.store;
  const cards = new Map();
  const list = h('ul', { class: 'cards', 'aria-label': 'Pending approvals' });
  const empty = h('p', { class: 'empty', hidden: true }, 'No pending approvals. New ones appear here as agents ask.');
  const status = h('p', { class: 'error', role: 'alert' });
  const more = h('p', { class: 'hint', hidden: true },
    `Showing the newest ${MAX_LOADED} pending approvals; decide some to see the rest.`);
  const count = h('span', { class: 'selected-count', 'aria-live': 'polite' }, '0 selected');
  const bulkReasonId = nextId('bulk-reason');
  const bulkReason = h('input', { id: bulkReasonId, type: 'text', autocomplete: 'off' });
  const bulkApprove = h('button', { type: 'button', class: 'approve', disabled: true }, 'Approve selected');
  const bulkDeny = h('button', { type: 'button', class: 'deny', disabled: true }, 'Deny selected');
  const selectAll = h('button', { type: 'button' }, 'Select all');
  const help = h('div', { class: 'help', hidden: true, id: 'shortcut-help' },
    h('h2', {}, 'Keyboard shortcuts'),
    h('dl', {}, SHORTCUTS.map(([k, what]) => [h('dt', {}, k), h('dd', {}, what)])));
  const helpButton = h('button', { type: 'button', 'aria-controls': 'shortcut-help', 'aria-expanded': 'false' }, 'Shortcuts (?)');

  const toolbar = h('div', { class: 'toolbar', role: 'toolbar', 'aria-label': 'Decide selected approvals' },
    count, selectAll, bulkApprove,
    h('div', { class: 'grow' }, h('label', { for: bulkReasonId }, 'Denial reason'), bulkReason),
    bulkDeny, helpButton);

  main.append(h('h1', {}, 'Pending approvals'), toolbar, help, status, more, empty, list);

  function selectedItems() {
    return [...cards.entries()]
      .filter(([, el]) => el.actions.selected())
      .map(([id]) => store.items.get(id))
      .filter(Boolean);
  }

  function refreshSelection() {
    const n = selectedItems().length;
    count.textContent = `${n} selected`;
    bulkApprove.disabled = n === 0;
    bulkDeny.disabled = n === 0;
    for (const el of cards.values()) el.classList.toggle('selected', el.actions.selected());
  }

  function render(added = []) {
    const items = store.sorted();
    const focused = document.activeElement;
    let focusLost = false;
    // Remove cards that are no longer pending.
    const live = new Set(items.map((i) => i.call_id));
    const order = [...cards.keys()];
    for (const id of order) {
      if (!live.has(id)) {
        const el = cards.get(id);
        if (el.contains(focused)) focusLost = order.indexOf(id);
        el.parentElement?.remove();
        cards.delete(id);
      }
    }
    // Insert new cards in order; keep existing ones (open forms stay).
    let previous = null;
    for (const item of items) {
      let el = cards.get(item.call_id);
      if (!el) {
        el = approvalCard(item, ctx, { onSelect: refreshSelection });
        cards.set(item.call_id, el);
      }
      const li = el.parentElement || h('li', {}, el);
      const want = previous ? previous.nextSibling : list.firstChild;
      if (want !== li) list.insertBefore(li, want);
      previous = li;
    }
    empty.hidden = items.length > 0 || !store.loaded;
    more.hidden = !store.truncated;
    status.textContent = store.error ? `The approvals could not be loaded: ${store.error.message}` : '';
    if (focusLost !== false) {
      const els = [...list.querySelectorAll('.card')];
      (els[Math.min(focusLost, els.length - 1)] || main).focus();
    }
    if (added.length === 1) announce('1 new approval.');
    else if (added.length > 1) announce(`${added.length} new approvals.`);
    refreshSelection();
  }

  async function decideSelected(decisionOf, verb) {
    const items = selectedItems();
    if (!items.length) return;
    bulkApprove.disabled = true;
    bulkDeny.disabled = true;
    const outcomes = await submit(items, decisionOf);
    const failed = outcomes.filter((o) => !o.ok);
    for (const o of outcomes) {
      if (o.ok || ['already_decided', 'unknown_calls', 'session_terminal'].includes(o.error.code)) {
        for (const id of o.calls) store.remove(id);
      }
    }
    const done = outcomes.filter((o) => o.ok).reduce((n, o) => n + o.calls.length, 0);
    status.textContent = failed.length
      ? failed.map((o) => `Session ${shortId(o.session)}: ${o.error.message}`).join('\n')
      : '';
    announce(`${verb} ${done} approval${done === 1 ? '' : 's'}.`);
    refreshSelection();
  }

  bulkApprove.addEventListener('click', () => decideSelected(() => ({ decision: 'approve' }), 'Approved'));
  bulkDeny.addEventListener('click', () => {
    const message = bulkReason.value.trim();
    decideSelected(() => (message ? { decision: 'deny', message } : { decision: 'deny' }), 'Denied');
  });
  selectAll.addEventListener('click', () => {
    const all = [...cards.values()];
    const every = all.every((el) => el.actions.selected());
    for (const el of all) if (el.actions.selected() === every) el.actions.toggle();
    refreshSelection();
  });
  function toggleHelp() {
    help.hidden = !help.hidden;
    helpButton.setAttribute('aria-expanded', String(!help.hidden));
  }
  helpButton.addEventListener('click', toggleHelp);

  function focusedCard() {
    const el = document.activeElement;
    return el instanceof Element ? el.closest('.card') : null;
  }

  function move(step) {
    const els = [...list.querySelectorAll('.card')];
    if (!els.length) return;
    const i = els.indexOf(focusedCard());
    const next = i < 0 ? (step > 0 ? 0 : els.length - 1) : Math.max(0, Math.min(els.length - 1, i + step));
    els[next].focus();
  }

  function onKey(event) {
    if (event.ctrlKey || event.metaKey || event.altKey || isTyping(event)) return;
    const card = focusedCard();
    const handled = (() => {
      switch (event.key) {
        case 'j': case 'ArrowDown': move(1); return true;
        case 'k': case 'ArrowUp': move(-1); return true;
        case '?': toggleHelp(); return true;
        case 'A': bulkApprove.click(); return true;
        case 'D': bulkReason.focus(); return true;
        default:
      }
      if (!card || !card.actions) return false;
      switch (event.key) {
        case 'x': card.actions.toggle(); return true;
        case 'a': card.actions.approve(); return true;
        case 'e': card.actions.edit(); return true;
        case 'd': card.actions.deny(); return true;
        case 'o': card.querySelector('a.session-link')?.click(); return true;
        default: return false;
      }
    })();
    if (handled) event.preventDefault();
  }

  document.addEventListener('keydown', onKey);
  const unsubscribe = store.subscribe(render);
  if (!store.loaded && !store.loading) store.reload();
  render();
  main.focus();
  return {
    destroy() {
      unsubscribe();
      document.removeEventListener('keydown', onKey);
    },
  };
}

