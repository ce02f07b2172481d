// The decision history of the tenant: who decided, when, which session and
// tool, what (approve, approve with an edit, deny, timeout, a standing
// rule), the reason and the argument diff, newest first, paged from the
// store (GET /v1/decisions) with filters by agent, tool and decider.

import { api } from './api.js';
import { h, clear, formatTime, nextId, isSessionId } from './dom.js';
import { sessionName, diffList } from './desk.js';

const PAGE = 50;

const KIND = {
  approve: 'Approved',
  approve_with_edit: 'Approved with edits',
  deny: 'Denied',
  timeout: 'Timed out',
  rule: 'Standing rule',
};

/** The filters, kept while the page is open. */
const filters = { agent: '', tool: '', by: '' };

function row(d) {
  const kind = KIND[d.decision] || d.decision;
  const outcome = d.decision === 'rule' ? `${kind}: ${d.approved ? 'allowed' : 'rejected'}` : kind;
  const session = isSessionId(d.root_session_id)
    ? h('a', { href: `#/s/${d.root_session_id}`, title: d.session_id }, sessionName(d.title, d.root_session_id))
    : sessionName(d.title, d.root_session_id);
  return h('li', { class: `decision-row ${d.approved ? 'approved' : 'denied'}`, dataset: { call: d.call_id, kind: d.decision } },
    h('p', { class: 'decision-head' },
      h('strong', { class: `outcome ${d.decision}` }, outcome), ' · ',
      h('span', { class: 'tool' }, d.tool || '(unknown tool)'), ' · ',
      h('span', { class: 'by' }, `by ${d.by || 'someone'}`), ' · ',
      h('time', { datetime: new Date(d.at_ms).toISOString() }, formatTime(d.at_ms))),
    h('p', { class: 'decision-session muted' }, 'Session: ', session,
      d.session_id !== d.root_session_id ? ` (subagent ${d.agent})` : ` (${d.agent})`),
    d.reason ? h('p', { class: 'reason-text' }, 'Reason: ', h('q', {}, d.reason)) : null,
    diffList(d.args_diff));
}

export function renderHistory(main, ctx) {
  let destroyed = false;
  let cursor = null;
  let generation = 0;
  const list = h('ol', { class: 'history', 'aria-label': 'Decisions, newest first' });
  const error = h('p', { class: 'error', role: 'alert' });
  const empty = h('p', { class: 'empty', hidden: true }, 'No decision matches these filters.');
  const more = h('button', { type: 'button', class: 'more', hidden: true }, 'Load older decisions');
  const field = (name, label, hint) => {
    const id = nextId(name);
    const input = h('input', { id, type: 'text', name, autocomplete: 'off', value: filters[name], placeholder: hint });
    return [input, h('div', {}, h('label', { for: id }, label), input)];
  };
  const [agent, agentBox] = field('agent', 'Agent', 'exact name');
  const [tool, toolBox] = field('tool', 'Tool', 'exact name');
  const [by, byBox] = field('by', 'Decided by', 'e.g. alice, system, rule:allow');
  const apply = h('button', { type: 'submit', class: 'primary' }, 'Filter');
  const form = h('form', { class: 'toolbar history-filters', role: 'search', 'aria-label': 'Filter decisions' },
    agentBox, toolBox, byBox, apply);
  main.append(h('h1', {}, 'Decision history'),
    h('p', { class: 'hint' }, 'Every decision of your tenant, newest first: from this page, the API, the CLI, an editor, a timeout or a standing rule.'),
    form, error, empty, list, more);
  ctx.setTitle('Decision history · overseer approvals');

  async function load(reset) {
    const mine = reset ? ++generation : generation;
    error.textContent = '';
    more.disabled = true;
    const q = new URLSearchParams({ limit: String(PAGE) });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    if (!reset && cursor) q.set('cursor', cursor);
    try {
      const page = await api('GET', `/v1/decisions?${q}`);
      if (destroyed || mine !== generation) return;
      if (reset) clear(list);
      list.append(...page.decisions.map(row));
      cursor = page.next_cursor;
      more.hidden = !cursor;
      empty.hidden = list.childElementCount > 0 || Boolean(cursor);
    } catch (e) {
      if (!destroyed) error.textContent = `The history could not be loaded: ${e.message}`;
    } finally {
      more.disabled = false;
    }
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    filters.agent = agent.value.trim();
    filters.tool = tool.value.trim();
    filters.by = by.value.trim();
    cursor = null;
    load(true);
  });
  more.addEventListener('click', () => load(false));
  // Decisions made while the view is open come first: read the first page
  // again when one is recorded.
  let refresh = null;
  const unsubscribe = ctx.onFeed((type) => {
    if (type !== 'decision_recorded' || refresh) return;
    refresh = setTimeout(() => {
      refresh = null;
      if (list.childElementCount <= PAGE) {
        cursor = null;
        load(true);
      }
    }, 300);
  });
  load(true);
  main.focus();
  return {
    destroy() {
      destroyed = true;
      unsubscribe();
      clearTimeout(refresh);
    },
  };
}
