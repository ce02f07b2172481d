// The inbox as a review desk: every pending approval of the tenant, kept
// live by the tenant event stream (a `reset`, the first event of every new
// connection, (re)loads the snapshot, GET /v1/approvals; later events add
// and remove cards), searchable and
// filtered (agent, tool, session title, text in the arguments), grouped by
// session or not, ordered by request or by deadline (calls close to their
// automatic denial are marked), and the cards that decide them: approve,
// edit (the diff is shown before it is confirmed), deny with a reason, a
// standing rule for the tool in the session, every call of a session at
// once. A token that may not decide (no approvals:write) sees the cards and
// no decide buttons.

import { api, ApiError } from './api.js';
import { h, clear, setText, announce, nextId, isTyping, isSessionId, warningsBlock } from './dom.js';
import { escapedJson } from './render.js';
import {
  sessionName, matches, compare, groupBySession, distinct, dueSoon, countdown, longText,
  longJson, editOf, diffList, watchClocks, unwatchClocks,
} from './desk.js';

/** Most pending approvals loaded into the page (pages of 200). */
const MAX_LOADED = 1000;
/** Above this many cards shown, the ones off screen are not laid out
 *  (`.board.many` in the stylesheet). */
const MANY_CARDS = 60;

/** Pending approvals by call id. */
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

  /** The cards in `order` (`newest` by default, or `deadline`). */
  sorted(order = 'newest') {
    return [...this.items.values()].sort(compare(order));
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

  /** Removes calls decided from this page (their events follow). */
  remove(...callIds) {
    let any = false;
    for (const id of callIds) any = this.items.delete(id) || any;
    if (any) this.changed();
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
          if (!this.loaded && cursor) {
            // The first load shows each page as it comes (cards are only
            // added); a reload replaces the list at once when complete.
            const added = page.approvals.map((i) => i.call_id).filter((id) => !this.items.has(id));
            for (const item of page.approvals) this.items.set(item.call_id, item);
            this.changed(added);
          }
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

/** Codes that mean "decided (or gone) elsewhere": the card can go. */
const GONE = ['already_decided', 'unknown_calls', 'session_terminal', 'not_found'];

function gone(error) {
  return error instanceof ApiError && (GONE.includes(error.code) || error.status === 404);
}

/** Decides `items` and takes from the inbox what was decided (or already
 *  was elsewhere). Resolves with {done, failed: [outcome]}. */
async function decideAll(items, decisionOf, store) {
  const outcomes = await submit(items, decisionOf);
  for (const o of outcomes) {
    if (o.ok || gone(o.error)) store?.remove(...o.calls);
  }
  return {
    done: outcomes.filter((o) => o.ok).reduce((n, o) => n + o.calls.length, 0),
    failed: outcomes.filter((o) => !o.ok && !gone(o.error)),
  };
}

function rootLabel(item) {
  return sessionName(item.title, item.root_session_id);
}

/** Why the call is asked: the model's text before it and the user message
 *  of its turn, in a disclosure that starts closed. */
function whyBox(item) {
  const c = item.context;
  const part = (label, t, cls) => (t && t.text
    ? h('div', { class: `why-part ${cls}` }, h('p', { class: 'why-label' }, label),
      longText('p', t.text, { class: 'why-text' },
        t.truncated ? `The server sent the first ${t.text.length} of ${t.bytes} bytes; the whole text is in the session.` : null))
    : null);
  const parts = c ? [part('The model said', c.model_text, 'model'), part('The user asked', c.user_message, 'user')].filter(Boolean) : [];
  return h('details', { class: 'why' },
    h('summary', {}, 'Why is this asked?'),
    parts.length ? parts : h('p', { class: 'hint' }, 'No text came with this call; open the session for its transcript.'));
}

/** The card of one pending approval. `ctx.store` is told what was decided;
 *  `ctx.may.decide` says whether it has decide buttons. */
export function approvalCard(item, ctx, { selectable = true, onSelect } = {}) {
  const canDecide = Boolean(ctx.may && ctx.may.decide);
  const titleId = nextId('card-title');
  const cardError = h('p', { class: 'error', role: 'alert' });
  const label = `${item.name} for ${rootLabel(item)}`;

  const checkbox = selectable && canDecide
    ? h('input', { type: 'checkbox', class: 'select', 'aria-label': `Select ${label}`, onChange: () => onSelect?.() })
    : null;

  const path = item.path && item.path.length > 1
    ? h('p', { class: 'path' }, 'Subagent path: ',
      item.path.map((step, i) => [
        i ? ' › ' : '',
        isSessionId(step.session_id)
          ? h('a', { href: `#/s/${step.session_id}`, title: step.session_id }, step.agent)
          : step.agent,
      ]))
    : null;

  const deadline = item.approval_deadline_ms;
  const soon = dueSoon(item);
  const dueMark = deadline
    ? h('p', { class: 'due-mark', hidden: !soon }, 'Close to its automatic denial: decide now or it is denied.')
    : null;

  const actions = canDecide ? h('div', { class: 'actions' }) : null;
  const forms = h('div', { class: 'forms' });

  const card = h('article', {
    class: `card${soon ? ' due-soon' : ''}`,
    tabindex: '0',
    'aria-labelledby': titleId,
    dataset: {
      call: item.call_id,
      session: item.session_id,
      root: item.root_session_id,
      ...(deadline ? { deadline: String(deadline), requested: String(item.requested_at_ms) } : {}),
    },
  },
  h('div', { class: 'card-head' }, checkbox,
    h('div', {},
      h('h2', { id: titleId }, h('span', { class: 'tool' }, item.name), ' ',
        h('span', { class: 'muted' }, `asked by ${item.agent}`)),
      h('p', {}, 'Session: ',
        isSessionId(item.root_session_id)
          ? h('a', { href: `#/s/${item.root_session_id}`, class: 'session-link', title: item.root_session_id }, rootLabel(item))
          : rootLabel(item)))),
  path,
  warningsBlock(item.warnings),
  item.description ? h('p', { class: 'description' }, item.description) : null,
  dueMark,
  whyBox(item),
  h('div', { class: 'arguments-box' }, h('p', { class: 'why-label' }, 'Arguments'),
    longJson(item.arguments, { class: 'arguments', 'aria-label': 'Arguments' })),
  item.outcome_unknown
    ? h('p', { class: 'warn' }, 'This call was running when the server stopped; whether it took effect is unknown. Approving runs it again.')
    : null,
  h('p', { class: 'times' }, 'Waiting ', countdown(item.requested_at_ms, 'since', { inCard: true }),
    deadline ? [' · denied automatically ', countdown(deadline, 'until', { inCard: true })] : null),
  actions, forms, cardError);
  watchClocks(card);

  if (!canDecide) {
    card.actions = { selected: () => false, toggle() {}, approve() {}, edit() {}, deny() {}, formOpen: () => false };
    return card;
  }

  function busy(on) {
    for (const b of card.querySelectorAll('button')) b.disabled = on;
  }

  async function decide(decision, { others = [] } = {}) {
    cardError.textContent = '';
    busy(true);
    const items = [item, ...others];
    const outcomes = await submit(items, () => decision);
    busy(false);
    const mine = outcomes.find((o) => o.calls.includes(item.call_id));
    const settled = outcomes.filter((o) => o !== mine && (o.ok || gone(o.error)));
    ctx.store?.remove(...settled.flatMap((o) => o.calls));
    if (mine.ok) {
      announce(`${decision.decision === 'approve' ? 'Approved' : 'Denied'} ${item.name}.`);
      ctx.store?.remove(...mine.calls);
      return true;
    }
    const e = mine.error;
    if (gone(e)) {
      announce(`${item.name} was already decided elsewhere.`);
      ctx.store?.remove(...mine.calls);
      return true;
    }
    if (e instanceof ApiError && e.code === 'invalid_override' && editor) {
      const detail = e.details && typeof e.details.error === 'object' ? e.details.error.error : null;
      showEditor();
      setText(editor.error, detail || e.message);
      editor.textarea.setAttribute('aria-invalid', 'true');
      editor.textarea.focus();
      return false;
    }
    cardError.textContent = e.message;
    return false;
  }

  // The edit form and the deny form are made when first opened: a
  // thousand cards should not build a thousand editors.
  let editor = null;
  let denier = null;

  function closeForms(focus) {
    if (editor) {
      editor.form.hidden = true;
      editor.preview.hidden = true;
    }
    if (denier) denier.form.hidden = true;
    editButton.setAttribute('aria-expanded', 'false');
    denyButton.setAttribute('aria-expanded', 'false');
    if (focus) card.focus();
  }

  function makeEditor() {
    const id = nextId('args');
    const textarea = h('textarea', {
      id, class: 'args-editor', spellcheck: 'false', autocomplete: 'off',
      // Hidden characters as JSON escapes: visible, and sent back exact.
      'aria-describedby': `${id}-help ${id}-error`, value: escapedJson(item.arguments),
    });
    const error = h('p', { id: `${id}-error`, class: 'field-error', role: 'alert' });
    const form = h('form', { class: 'edit', hidden: true, 'aria-label': `Edit arguments of ${label}` },
      h('label', { for: id }, 'Arguments (JSON)'),
      textarea,
      h('p', { id: `${id}-help`, class: 'hint' },
        'Change a value, add a key, or delete an optional one. You see the changes before they are approved; the server checks the result against the tool\'s schema.'),
      error,
      h('div', { class: 'form-actions' },
        h('button', { type: 'submit', class: 'primary' }, 'Review changes'),
        h('button', { type: 'button', onClick: () => closeForms(true) }, 'Cancel')));
    const changes = h('div', { class: 'changes' });
    const confirm = h('button', { type: 'button', class: 'approve confirm-edit' }, 'Approve with these changes');
    const back = h('button', { type: 'button', class: 'back-to-edit' }, 'Back to editing');
    const preview = h('section', { class: 'edit-preview', hidden: true, 'aria-label': `Changes to ${item.name}'s arguments` },
      h('p', {}, `Approve ${item.name} with these changes to what the model proposed:`),
      changes,
      h('div', { class: 'form-actions' }, confirm, back));
    let pending = null;
    textarea.addEventListener('input', () => {
      textarea.removeAttribute('aria-invalid');
      error.textContent = '';
    });
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      let value;
      try {
        value = JSON.parse(textarea.value);
      } catch (e) {
        error.textContent = `Not valid JSON: ${e.message}`;
        textarea.setAttribute('aria-invalid', 'true');
        textarea.focus();
        return;
      }
      if (!value || typeof value !== 'object' || Array.isArray(value)) {
        error.textContent = 'The arguments must be a JSON object.';
        textarea.setAttribute('aria-invalid', 'true');
        textarea.focus();
        return;
      }
      const edit = editOf(item.arguments, value);
      if (!Object.keys(edit.diff).length) {
        error.textContent = 'Nothing changed: use Approve to approve the call as proposed.';
        textarea.focus();
        return;
      }
      pending = edit;
      clear(changes).append(diffList(edit.diff, 'Changes to approve'));
      form.hidden = true;
      preview.hidden = false;
      confirm.focus();
    });
    confirm.addEventListener('click', () => {
      if (!pending) return;
      const decision = { decision: 'approve' };
      if (Object.keys(pending.override).length) decision.override_args = pending.override;
      if (pending.remove.length) decision.remove_args = pending.remove;
      decide(decision);
    });
    back.addEventListener('click', showEditor);
    forms.append(form, preview);
    return { form, preview, textarea, error };
  }

  function showEditor() {
    editor = editor || makeEditor();
    editor.preview.hidden = true;
    editor.form.hidden = false;
    editButton.setAttribute('aria-expanded', 'true');
    editor.textarea.focus();
  }

  function makeDenier() {
    const id = nextId('reason');
    const reason = h('input', { id, type: 'text', class: 'reason', autocomplete: 'off' });
    const form = h('form', { class: 'deny-form', hidden: true, 'aria-label': `Deny ${label}` },
      h('label', { for: id }, 'Reason (the model sees it)'),
      reason,
      h('div', { class: 'form-actions' },
        h('button', { type: 'submit', class: 'deny' }, 'Deny'),
        h('button', { type: 'button', onClick: () => closeForms(true) }, 'Cancel')));
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const message = reason.value.trim();
      await decide(message ? { decision: 'deny', message } : { decision: 'deny' });
    });
    forms.append(form);
    return { form, reason };
  }

  /** The other pending calls of this tool in this session (a standing
   *  rule answers them too). */
  function sameToolHere() {
    if (!ctx.store) return [];
    return [...ctx.store.items.values()].filter((i) => i.session_id === item.session_id
      && i.name === item.name && i.call_id !== item.call_id);
  }

  async function standingRule(rule) {
    cardError.textContent = '';
    busy(true);
    try {
      await api('POST', `/v1/sessions/${item.session_id}/rules`, { tool: item.name, rule });
    } catch (e) {
      busy(false);
      if (gone(e)) {
        ctx.store?.remove(item.call_id);
        return;
      }
      cardError.textContent = e.message;
      return;
    }
    busy(false);
    announce(`From now on ${item.name} is ${rule === 'allow' ? 'allowed' : 'rejected'} in this session without asking.`);
    // The rule answers the calls asked from now on; the ones waiting are
    // decided the same way here.
    await decide(rule === 'allow'
      ? { decision: 'approve' }
      : { decision: 'deny', message: `rejected by a standing rule of this session for ${item.name}` },
    { others: sameToolHere() });
  }

  const approveButton = h('button', { type: 'button', class: 'approve', 'aria-label': `Approve ${label}` }, 'Approve');
  const editButton = h('button', { type: 'button', class: 'edit', 'aria-label': `Edit arguments of ${label}`, 'aria-expanded': 'false' }, 'Edit arguments');
  const denyButton = h('button', { type: 'button', class: 'deny', 'aria-label': `Deny ${label}`, 'aria-expanded': 'false' }, 'Deny…');
  const allowRule = h('button', { type: 'button', class: 'rule-allow', title: 'A standing rule of this session: later calls of this tool run without asking.' },
    `Always allow ${item.name} here`);
  const rejectRule = h('button', { type: 'button', class: 'rule-reject', title: 'A standing rule of this session: later calls of this tool are rejected without asking.' },
    `Always reject ${item.name} here`);
  actions.append(approveButton, editButton, denyButton, allowRule, rejectRule);

  approveButton.addEventListener('click', () => decide({ decision: 'approve' }));
  editButton.addEventListener('click', () => {
    const open = !editor || (editor.form.hidden && editor.preview.hidden);
    closeForms(false);
    if (open) showEditor();
  });
  denyButton.addEventListener('click', () => {
    const open = !denier || denier.form.hidden;
    closeForms(false);
    if (!open) return;
    denier = denier || makeDenier();
    denier.form.hidden = false;
    denyButton.setAttribute('aria-expanded', 'true');
    denier.reason.focus();
  });
  allowRule.addEventListener('click', () => standingRule('allow'));
  rejectRule.addEventListener('click', () => standingRule('reject'));
  card.addEventListener('keydown', (event) => {
    const open = (editor && (!editor.form.hidden || !editor.preview.hidden)) || (denier && !denier.form.hidden);
    if (event.key === 'Escape' && open) {
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
  };
  return card;
}

const SHORTCUTS = [
  ['j / ↓', 'next approval'],
  ['k / ↑', 'previous approval'],
  ['/', 'search'],
  ['x', 'select or unselect'],
  ['a', 'approve'],
  ['e', 'edit arguments, review, then approve'],
  ['d', 'deny with a reason'],
  ['o', 'open its session'],
  ['A', 'approve every selected'],
  ['D', 'reason for denying every selected (Enter denies them)'],
  ['?', 'show or hide these shortcuts'],
];

/** The review desk's settings, kept while the page is open (not stored). */
const view = { search: '', agent: '', tool: '', order: 'newest', grouped: false };

/** The inbox view. */
export function renderInbox(main, ctx) {
  const store = ctx.store;
  const canDecide = Boolean(ctx.may && ctx.may.decide);
  const cards = new Map();
  const groups = new Map();
  const flat = h('ul', { class: 'cards', 'aria-label': 'Pending approvals' });
  const board = h('div', { class: 'board' });
  const empty = h('p', { class: 'empty', hidden: true }, 'No pending approvals. New ones appear here as agents ask.');
  const loading = h('p', { class: 'hint loading' }, 'Loading the pending approvals…');
  const none = h('p', { class: 'empty none-shown', hidden: true }, 'No pending approval matches the search and filters.');
  const status = h('p', { class: 'error', role: 'alert' });
  const more = h('p', { class: 'hint', hidden: true },
    `Showing the newest ${MAX_LOADED} pending approvals; decide some to see the rest.`);

  // Search, filters, order, grouping.
  const searchId = nextId('search');
  const search = h('input', { id: searchId, type: 'search', class: 'search', autocomplete: 'off', value: view.search, placeholder: 'title, agent, tool, arguments' });
  const agentId = nextId('agent');
  const agentSelect = h('select', { id: agentId, class: 'filter-agent' });
  const toolId = nextId('tool');
  const toolSelect = h('select', { id: toolId, class: 'filter-tool' });
  const orderId = nextId('order');
  const orderSelect = h('select', { id: orderId, class: 'order' },
    h('option', { value: 'newest' }, 'Newest request first'),
    h('option', { value: 'deadline' }, 'Soonest automatic denial first'));
  orderSelect.value = view.order;
  const groupBox = h('input', { type: 'checkbox', class: 'group-by-session', id: nextId('group'), checked: view.grouped });
  const shownCount = h('p', { class: 'shown-count hint', 'aria-live': 'polite' });
  const filters = h('div', { class: 'toolbar filters', role: 'search', 'aria-label': 'Search and filter approvals' },
    h('div', { class: 'grow' }, h('label', { for: searchId }, 'Search'), search),
    h('div', {}, h('label', { for: agentId }, 'Agent'), agentSelect),
    h('div', {}, h('label', { for: toolId }, 'Tool'), toolSelect),
    h('div', {}, h('label', { for: orderId }, 'Order'), orderSelect),
    h('div', { class: 'check' }, groupBox, h('label', { for: groupBox.id }, 'Group by session')),
    shownCount);

  const count = h('span', { class: 'selected-count', 'aria-live': 'polite' }, '0 selected');
  const bulkReasonId = nextId('bulk-reason');
  const bulkReason = h('input', { id: bulkReasonId, type: 'text', class: 'bulk-reason', autocomplete: 'off' });
  const bulkApprove = h('button', { type: 'button', class: 'approve bulk-approve', disabled: true }, 'Approve selected');
  // Never disabled: Enter in the reason submits the form, and a form whose
  // submit button is disabled is not submitted.
  const bulkDeny = h('button', { type: 'submit', class: 'deny bulk-deny' }, 'Deny selected');
  const selectAll = h('button', { type: 'button', class: 'select-all' }, 'Select all shown');
  const help = h('div', { class: 'help', hidden: true, id: 'shortcut-help' },
    h('h2', {}, 'Keyboard shortcuts'),
    h('dl', {}, SHORTCUTS.map(([k, what]) => [h('dt', {}, k), h('dd', {}, what)])));
  const helpButton = h('button', { type: 'button', 'aria-controls': 'shortcut-help', 'aria-expanded': 'false' }, 'Shortcuts (?)');
  // A form, so that Enter in the reason denies the selection.
  const bulk = canDecide
    ? h('form', { class: 'toolbar bulk', role: 'toolbar', 'aria-label': 'Decide selected approvals' },
      count, selectAll, bulkApprove,
      h('div', { class: 'grow' }, h('label', { for: bulkReasonId }, 'Denial reason'), bulkReason),
      bulkDeny, helpButton)
    : h('p', { class: 'read-only hint' },
      'Read-only: your token may see approvals but not decide them (deciding needs approvals:write). ', helpButton);

  main.append(h('h1', {}, 'Pending approvals'), filters, bulk, help, status, more, loading, empty, none, board);

  function shownCards() {
    return [...board.querySelectorAll('.card')];
  }

  function selectedItems() {
    return shownCards()
      .filter((el) => el.actions && el.actions.selected())
      .map((el) => store.items.get(el.dataset.call))
      .filter(Boolean);
  }

  function refreshSelection() {
    if (!canDecide) return;
    const n = selectedItems().length;
    count.textContent = `${n} selected`;
    bulkApprove.disabled = n === 0;
    for (const el of cards.values()) el.classList.toggle('selected', el.actions.selected());
  }

  /** Puts `nodes` as the children of `parent`, in order, moving only what
   *  is out of place, and takes away the rest. */
  function place(parent, nodes) {
    let previous = null;
    for (const node of nodes) {
      const want = previous ? previous.nextSibling : parent.firstChild;
      if (want !== node) parent.insertBefore(node, want);
      previous = node;
    }
    for (let rest = previous ? previous.nextSibling : parent.firstChild; rest;) {
      const next = rest.nextSibling;
      rest.remove();
      rest = next;
    }
  }

  function options(select, values, all, current) {
    const have = [...select.options].map((o) => o.value);
    const want = ['', ...values];
    if (current && !want.includes(current)) want.push(current);
    if (have.join('\n') !== want.join('\n')) {
      clear(select).append(...want.map((v) => h('option', { value: v }, v || all)));
    }
    select.value = current;
  }

  function cardOf(item) {
    let el = cards.get(item.call_id);
    if (!el) {
      el = approvalCard(item, ctx, { onSelect: refreshSelection });
      cards.set(item.call_id, el);
    }
    return el.parentElement && el.parentElement.tagName === 'LI' ? el.parentElement : h('li', {}, el);
  }

  function groupOf(group) {
    let g = groups.get(group.key);
    if (!g) {
      const first = group.items[0];
      const list = h('ul', { class: 'cards', 'aria-label': `Pending approvals of ${rootLabel(first)}` });
      const heading = h('h2', {},
        isSessionId(group.key) ? h('a', { href: `#/s/${group.key}`, title: group.key }, rootLabel(first)) : rootLabel(first));
      const n = h('span', { class: 'group-count muted' });
      const approveAll = canDecide ? h('button', { type: 'button', class: 'approve approve-session' }, 'Approve all') : null;
      approveAll?.addEventListener('click', async () => {
        const items = store.sorted().filter((i) => i.root_session_id === group.key);
        approveAll.disabled = true;
        const { done, failed } = await decideAll(items, () => ({ decision: 'approve' }), store);
        approveAll.disabled = false;
        status.textContent = failed.map((o) => `${sessionName(null, o.session)}: ${o.error.message}`).join('\n');
        announce(`Approved ${done} approval${done === 1 ? '' : 's'} of ${rootLabel(first)}.`);
      });
      const section = h('section', { class: 'group', dataset: { session: group.key } },
        h('div', { class: 'group-head' }, heading, n, approveAll), list);
      g = { section, list, n, approveAll };
      groups.set(group.key, g);
    }
    const k = group.items.length;
    g.n.textContent = `${k} pending`;
    if (g.approveAll) g.approveAll.textContent = `Approve all ${k} of this session`;
    return g;
  }

  let firstCards = true;
  let allCards = false;

  function render(added = []) {
    const started = performance.now();
    const items = store.sorted(view.order);
    options(agentSelect, distinct(items, 'agent'), 'All agents', view.agent);
    options(toolSelect, distinct(items, 'name'), 'All tools', view.tool);
    const focused = document.activeElement;
    const before = shownCards();
    const focusIndex = before.findIndex((el) => el.contains(focused));
    // Cards no longer pending go for good.
    const live = new Set(items.map((i) => i.call_id));
    for (const [id, el] of cards) {
      if (!live.has(id)) {
        el.parentElement?.remove();
        unwatchClocks(el);
        cards.delete(id);
      }
    }
    const shown = items.filter((i) => matches(i, view));
    if (view.grouped) {
      const sections = [];
      const keys = new Set();
      for (const group of groupBySession(shown)) {
        const g = groupOf(group);
        place(g.list, group.items.map(cardOf));
        sections.push(g.section);
        keys.add(group.key);
      }
      for (const key of groups.keys()) if (!keys.has(key)) groups.delete(key);
      place(board, sections);
    } else {
      place(flat, shown.map(cardOf));
      place(board, [flat]);
    }
    board.classList.toggle('many', shown.length > MANY_CARDS);
    loading.hidden = store.loaded || Boolean(store.error);
    empty.hidden = items.length > 0 || !store.loaded;
    none.hidden = shown.length > 0 || items.length === 0;
    shownCount.textContent = shown.length === items.length
      ? `${items.length} pending`
      : `Showing ${shown.length} of ${items.length} pending`;
    more.hidden = !store.truncated;
    status.textContent = store.error ? `The approvals could not be loaded: ${store.error.message}` : status.textContent;
    if (focusIndex >= 0 && !board.contains(focused)) {
      const els = shownCards();
      (els[Math.min(focusIndex, els.length - 1)] || main).focus();
    }
    if (added.length === 1) announce('1 new approval.');
    else if (added.length > 1) announce(`${added.length} new approvals.`);
    refreshSelection();
    const ended = performance.now();
    performance.measure('inbox-render', { start: started, end: ended });
    if (firstCards && shown.length) {
      firstCards = false;
      // From the page's start to the first cards on screen.
      performance.mark('inbox-first-cards', { startTime: ended });
    }
    if (!allCards && store.loaded) {
      allCards = true;
      performance.mark('inbox-all-cards', { startTime: ended });
    }
  }

  function refilter(what) {
    const started = performance.now();
    render();
    performance.measure(`inbox-filter-${what}`, { start: started, end: performance.now() });
  }

  search.addEventListener('input', () => {
    view.search = search.value;
    refilter('search');
  });
  agentSelect.addEventListener('change', () => {
    view.agent = agentSelect.value;
    refilter('agent');
  });
  toolSelect.addEventListener('change', () => {
    view.tool = toolSelect.value;
    refilter('tool');
  });
  orderSelect.addEventListener('change', () => {
    view.order = orderSelect.value;
    refilter('order');
  });
  groupBox.addEventListener('change', () => {
    view.grouped = groupBox.checked;
    refilter('group');
  });

  async function decideSelected(decisionOf, verb) {
    const items = selectedItems();
    if (!items.length) {
      status.textContent = 'Select approvals first (x on a card, or Select all shown).';
      return;
    }
    bulkApprove.disabled = true;
    bulkDeny.disabled = true;
    const { done, failed } = await decideAll(items, decisionOf, store);
    bulkDeny.disabled = false;
    status.textContent = failed.map((o) => `${sessionName(null, o.session)}: ${o.error.message}`).join('\n');
    announce(`${verb} ${done} approval${done === 1 ? '' : 's'}.`);
    refreshSelection();
  }

  function toggleHelp() {
    help.hidden = !help.hidden;
    helpButton.setAttribute('aria-expanded', String(!help.hidden));
  }
  helpButton.addEventListener('click', toggleHelp);

  if (canDecide) {
    bulkApprove.addEventListener('click', () => decideSelected(() => ({ decision: 'approve' }), 'Approved'));
    bulk.addEventListener('submit', (event) => {
      event.preventDefault();
      const message = bulkReason.value.trim();
      decideSelected(() => (message ? { decision: 'deny', message } : { decision: 'deny' }), 'Denied');
    });
    selectAll.addEventListener('click', () => {
      const all = shownCards();
      const every = all.every((el) => el.actions.selected());
      for (const el of all) if (el.actions.selected() === every) el.actions.toggle();
      refreshSelection();
    });
  }

  function focusedCard() {
    const el = document.activeElement;
    return el instanceof Element ? el.closest('.card') : null;
  }

  function move(step) {
    const els = shownCards();
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
        case '/': search.focus(); return true;
        default:
      }
      if (!canDecide) {
        if (card && event.key === 'o') {
          card.querySelector('a.session-link')?.click();
          return true;
        }
        return false;
      }
      switch (event.key) {
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
  // The snapshot is read when the tenant stream says so (its first event
  // on a new connection is a `reset`): a read started before that could
  // miss what happened in between, and would have to be read again.
  const unsubscribe = store.subscribe(render);
  render();
  main.focus();
  return {
    destroy() {
      unsubscribe();
      document.removeEventListener('keydown', onKey);
      for (const el of cards.values()) unwatchClocks(el);
    },
  };
}
