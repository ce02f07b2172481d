// One session: its transcript streaming live (the per-session event
// stream, resumed after the state it loaded), each tool call with its state,
// decision (who, when, argument diff) and result, the pending approvals of
// its tree, the delegation tree with statuses and usage, and the actions:
// send a message, cancel, done. Long texts (a model's 100 KB answer, a
// large result) are collapsed with "Show all".

import { api, ApiError, EventStream } from './api.js';
import { h, append, clear, setText, announce, pretty, formatTime, nextId, isSessionId } from './dom.js';
import { display } from './render.js';
import { sessionName, longText, diffList, unwatchClocks } from './desk.js';
import { approvalCard } from './inbox.js';

const TERMINAL = new Set(['completed', 'failed', 'cancelled']);

function usageText(u) {
  if (!u) return '';
  const n = (count, what) => `${count} ${what}${count === 1 ? '' : 's'}`;
  return `${n(u.input_tokens + u.output_tokens, 'token')} (${u.input_tokens} in, ${u.output_tokens} out) · ${n(u.provider_requests, 'request')} · ${n(u.tool_calls, 'tool call')}`;
}

function decisionView(record) {
  if (!record) return null;
  const d = record.decision || {};
  const who = record.by || 'someone';
  const when = record.at_ms ? formatTime(record.at_ms) : '';
  const lines = [];
  if (d.decision === 'deny') {
    lines.push(h('p', { class: 'decision' }, `Denied by ${who} at ${when}`, d.message ? [': ', h('q', {}, d.message)] : ''));
  } else {
    lines.push(h('p', { class: 'decision' }, `Approved by ${who} at ${when}`));
  }
  lines.push(diffList(record.args_diff));
  if (record.metadata) lines.push(h('pre', { 'aria-label': 'Decision metadata' }, pretty(record.metadata)));
  return lines.filter(Boolean);
}

/** A tool call block that events update in place. */
class CallView {
  constructor(id, name, args) {
    this.state = h('span', { class: 'state' });
    this.decision = h('div', { class: 'decision-box' });
    this.result = h('div', { class: 'result-box' });
    this.argsBox = h('div', { class: 'args-box' });
    this.setArgs(args);
    this.el = h('div', { class: 'call', dataset: { call: id } },
      h('p', {}, 'Tool call ', h('strong', { class: 'tool' }, name), ' · ', this.state),
      this.argsBox, this.decision, this.result);
    this.setState('proposed');
  }

  /** The arguments shown: as proposed, then those that ran. */
  setArgs(args) {
    this.argsValue = args;
    clear(this.argsBox).append(longText('pre', pretty(args), { class: 'call-args', 'aria-label': 'Arguments' }));
  }

  setState(state) {
    this.state.className = `state ${state}`;
    this.state.textContent = state.replace(/_/g, ' ');
    this.el.dataset.state = state;
  }

  setDecision(record) {
    clear(this.decision).append(...[decisionView(record)].flat().filter(Boolean));
  }

  setResult(result) {
    clear(this.result).append(h('p', { class: 'hint' }, 'Result'),
      longText('pre', typeof result === 'string' ? result : pretty(result), { class: 'call-result', 'aria-label': 'Result' }));
  }

  /** From a stored call record. */
  fill(call) {
    this.setState(call.state);
    if (call.effective_arguments) this.setArgs(call.effective_arguments);
    if (call.decision) this.setDecision(call.decision);
    if (call.result !== undefined && call.result !== null) this.setResult(call.result);
  }
}

export function renderSession(main, id, ctx) {
  let destroyed = false;
  let stream = null;
  let header = null;
  const calls = new Map();
  let streaming = null;

  const title = h('h1', {}, sessionName(null, id));
  const meta = h('div', { class: 'meta' });
  const statusEl = h('span', { class: 'status', role: 'status' });
  const usage = h('span', { class: 'usage' });
  const errorEl = h('p', { class: 'error', role: 'alert' });
  const transcript = h('ol', { class: 'transcript', 'aria-label': 'Transcript' });
  const pendingList = h('ul', { class: 'cards', 'aria-label': 'Pending approvals of this session' });
  const pendingSection = h('section', { 'aria-labelledby': 'pending-title', hidden: true },
    h('h2', { id: 'pending-title' }, 'Waiting for your decision'), pendingList);
  const tree = h('div', { class: 'tree-box' });
  const cancelButton = h('button', { type: 'button', class: 'deny', id: 'cancel-session' }, 'Cancel session');
  const doneButton = h('button', { type: 'button', id: 'done-session' }, 'Mark done');
  const messageId = nextId('message');
  const message = h('textarea', { id: messageId, class: 'prose', rows: '3' });
  const sendButton = h('button', { type: 'submit', class: 'primary' }, 'Send');
  const messageForm = h('form', { class: 'message-form', 'aria-label': 'Send a message' },
    h('label', { for: messageId }, 'Message'), message,
    h('div', { class: 'form-actions' }, sendButton));

  main.append(title, h('div', { class: 'meta' }, statusEl, usage), meta, errorEl, pendingSection,
    h('div', { class: 'split' },
      h('section', { 'aria-labelledby': 'transcript-title' },
        h('h2', { id: 'transcript-title' }, 'Transcript'), transcript, messageForm,
        h('div', { class: 'actions' }, cancelButton, doneButton)),
      h('section', { 'aria-labelledby': 'tree-title' },
        h('h2', { id: 'tree-title' }, 'Delegation tree'), tree)));

  // A token that may not drive sessions gets no form and no actions.
  const canWrite = !ctx.may || ctx.may.write !== false;
  messageForm.hidden = !canWrite;
  cancelButton.hidden = !canWrite;
  doneButton.hidden = !canWrite;

  function setStatus(status, stopReason) {
    statusEl.className = `status ${status}`;
    statusEl.textContent = status.replace(/_/g, ' ') + (stopReason ? ` (last turn: ${stopReason.replace(/_/g, ' ')})` : '');
    const terminal = TERMINAL.has(status);
    cancelButton.disabled = terminal;
    doneButton.disabled = terminal;
    sendButton.disabled = terminal;
    message.disabled = terminal;
  }

  /** A transcript text: long ones collapse with "Show all". */
  function textOf(text) {
    return longText('p', text, { class: 'text' });
  }

  function entry(kind, who, ...content) {
    const li = h('li', { class: `entry ${kind}` }, h('div', { class: 'who' }, who), ...content);
    transcript.append(li);
    return li;
  }

  // "Fork from here": a new session of the same tenant with this
  // session's first `index` transcript entries (POST /v1/sessions/{id}/fork).
  function forkButton(index) {
    const button = h('button', { type: 'button', class: 'fork', 'data-index': String(index) }, 'Fork from here');
    // Forking creates a session: not offered to a read-only token.
    button.hidden = !canWrite;
    button.addEventListener('click', () => act(button, 'fork', { at: { index } }, (fork) => {
      if (isSessionId(fork.id)) location.hash = `#/s/${fork.id}`;
    }));
    return button;
  }

  function call(idOf, name, args) {
    let view = calls.get(idOf);
    if (!view) {
      view = new CallView(idOf, name, args);
      calls.set(idOf, view);
      const host = transcript.lastElementChild && transcript.lastElementChild.classList.contains('assistant')
        ? transcript.lastElementChild
        : entry('assistant', 'assistant');
      host.append(view.el);
    }
    return view;
  }

  function renderState(s) {
    header = s;
    ctx.setTitle(`${display(sessionName(s.title, s.id), false)} · overseer approvals`);
    setText(title, sessionName(s.title, s.id));
    append(clear(meta), [
      h('span', {}, `Agent: ${s.agent}`),
      h('span', {}, `Created ${formatTime(s.created_at_ms)}`),
      s.parent && isSessionId(s.parent.session_id)
        ? h('span', {}, 'Delegated by ', h('a', { href: `#/s/${s.parent.session_id}`, title: s.parent.session_id }, sessionName(null, s.parent.session_id)))
        : null,
      s.error ? h('span', { class: 'error' }, s.error) : null]);
    setStatus(s.status, s.last_stop_reason);
    usage.textContent = usageText(s.usage);
    clear(transcript);
    calls.clear();
    streaming = null;
    (s.transcript || []).forEach((e, i) => {
      if (e.role === 'user') entry('user', 'user', textOf(e.text), forkButton(i + 1));
      else if (e.role === 'assistant') {
        const li = entry('assistant', 'assistant', e.text ? textOf(e.text) : null, forkButton(i + 1));
        for (const c of e.tool_calls || []) {
          const view = new CallView(c.id, c.name, c.arguments);
          calls.set(c.id, view);
          li.append(view.el);
        }
      } else if (e.role === 'tool_result') {
        const view = call(e.call.id, e.call.name, e.call.arguments);
        view.fill(e.call);
        view.el.append(forkButton(i + 1));
      }
    });
    for (const c of s.open_calls || []) call(c.id, c.name, c.arguments).fill(c);
    for (const m of s.inbox || []) entry('user queued', 'user (queued)', textOf(m.text));
  }

  function onEvent(type, e) {
    switch (type) {
      case 'text_delta': {
        if (!streaming) {
          streaming = entry('assistant streaming', 'assistant', h('p', { class: 'text' }));
        }
        append(streaming.querySelector('.text'), e.text);
        break;
      }
      case 'message_accepted':
        entry(e.queued ? 'user queued' : 'user', e.queued ? 'user (queued)' : 'user', textOf(e.text));
        break;
      case 'assistant_message': {
        const li = streaming || entry('assistant', 'assistant', h('p', { class: 'text' }));
        li.classList.remove('streaming');
        // The streamed text gives way to the step's whole text, collapsed
        // when long.
        const text = li.querySelector('.text');
        const whole = e.text ? textOf(e.text) : null;
        if (whole) text.replaceWith(whole);
        else text.remove();
        streaming = null;
        break;
      }
      case 'tool_call_proposed':
        call(e.call_id, e.name, e.arguments);
        break;
      case 'approval_requested':
        call(e.call_id, e.name, e.arguments).setState('awaiting_approval');
        break;
      case 'decision_recorded': {
        const view = calls.get(e.call_id);
        if (view) {
          view.setDecision(e.record);
          view.setState(e.record.decision.decision === 'deny' ? 'denied' : 'approved');
          const diff = e.record.args_diff;
          const args = view.argsValue;
          if (diff && typeof diff === 'object' && args && typeof args === 'object' && !Array.isArray(args)) {
            // The arguments that run: the proposal with the edited keys
            // replaced and the removed ones gone.
            const merged = { ...args };
            for (const [k, change] of Object.entries(diff)) {
              if (change && change.removed) delete merged[k];
              else merged[k] = change ? change.to : null;
            }
            view.setArgs(merged);
          }
        }
        break;
      }
      case 'tool_call_started':
        calls.get(e.call_id)?.setState('running');
        break;
      case 'tool_call_finished': {
        const view = calls.get(e.call_id);
        if (view) {
          view.setState(e.state);
          view.setResult(e.result);
        }
        break;
      }
      case 'status_changed':
        setStatus(e.status, header && header.last_stop_reason);
        if (header) header.status = e.status;
        announce(`Session ${e.status.replace(/_/g, ' ')}.`);
        break;
      case 'turn_ended':
        if (header) header.last_stop_reason = e.stop_reason;
        setStatus(header ? header.status : 'awaiting_input', e.stop_reason);
        usage.textContent = usageText(e.usage);
        break;
      case 'error':
        entry('error', 'error', h('p', { class: 'text' }, e.message));
        break;
      default:
    }
  }

  function renderNode(node) {
    const label = node.session_id === id
      ? h('strong', {}, node.agent)
      : h('a', { href: `#/s/${node.session_id}` }, node.agent);
    return h('li', { dataset: { session: node.session_id } },
      label, ' · ', h('span', { class: `status ${node.status}` }, node.status.replace(/_/g, ' ')),
      node.pending && node.pending.length ? ` · ${node.pending.length} waiting` : '',
      h('div', { class: 'hint' }, usageText(node.subtree_usage)),
      node.children && node.children.length ? h('ul', {}, node.children.map(renderNode)) : null);
  }

  let treeIds = new Set([id]);
  let treeTimer = null;
  async function loadTree() {
    treeTimer = null;
    try {
      const root = await api('GET', `/v1/sessions/${id}/tree`);
      if (destroyed) return;
      const ids = new Set();
      (function walk(n) { ids.add(n.session_id); (n.children || []).forEach(walk); })(root);
      treeIds = ids;
      clear(tree).append(h('ul', { class: 'tree', 'aria-label': 'Delegation tree' }, renderNode(root)));
    } catch (e) {
      if (!destroyed) clear(tree).append(h('p', { class: 'error' }, e.message));
    }
  }
  function refreshTree() {
    if (!treeTimer) treeTimer = setTimeout(loadTree, 150);
  }

  // Pending approvals of this session's tree, from the live inbox.
  const cards = new Map();
  function renderPending() {
    const items = ctx.store.sorted().filter((i) => i.root_session_id === id || treeIds.has(i.session_id));
    const live = new Set(items.map((i) => i.call_id));
    for (const [callId, el] of cards) {
      if (!live.has(callId)) {
        el.parentElement?.remove();
        unwatchClocks(el);
        cards.delete(callId);
      }
    }
    for (const item of items) {
      if (!cards.has(item.call_id)) {
        const el = approvalCard(item, ctx, { selectable: false });
        cards.set(item.call_id, el);
        pendingList.append(h('li', {}, el));
      }
    }
    pendingSection.hidden = items.length === 0;
  }

  const unsubscribeStore = ctx.store.subscribe(renderPending);
  const unsubscribeFeed = ctx.onFeed((type, data) => {
    if (['status_changed', 'session_created', 'turn_ended', 'tool_call_finished'].includes(type)
      && (treeIds.has(data.session_id) || type === 'session_created')) {
      refreshTree();
    }
  });

  async function act(button, path, body, done) {
    errorEl.textContent = '';
    button.disabled = true;
    try {
      const answer = await api('POST', `/v1/sessions/${id}/${path}`, body);
      done?.(answer);
    } catch (e) {
      errorEl.textContent = e.message;
    } finally {
      if (!header || !TERMINAL.has(header.status)) button.disabled = false;
    }
  }

  let confirmTimer = null;
  cancelButton.addEventListener('click', () => {
    if (cancelButton.dataset.confirm !== 'yes') {
      cancelButton.dataset.confirm = 'yes';
      cancelButton.textContent = 'Confirm: cancel this session and its subagents';
      confirmTimer = setTimeout(() => {
        cancelButton.dataset.confirm = '';
        cancelButton.textContent = 'Cancel session';
      }, 6000);
      return;
    }
    clearTimeout(confirmTimer);
    cancelButton.dataset.confirm = '';
    cancelButton.textContent = 'Cancel session';
    act(cancelButton, 'cancel', undefined, () => announce('Session cancelled.'));
  });
  doneButton.addEventListener('click', () => act(doneButton, 'done', undefined, () => announce('Session marked done.')));
  messageForm.addEventListener('submit', (event) => {
    event.preventDefault();
    const text = message.value.trim();
    if (!text) {
      message.focus();
      return;
    }
    act(sendButton, 'messages', { text }, () => {
      message.value = '';
      announce('Message sent.');
    });
  });

  (async () => {
    try {
      const s = await api('GET', `/v1/sessions/${id}`);
      if (destroyed) return;
      renderState(s);
      stream = new EventStream(`/v1/sessions/${id}/events`, {
        event: onEvent,
        gone: () => { errorEl.textContent = 'This session no longer exists.'; },
      }, s.last_event_seq);
      await loadTree();
      renderPending();
    } catch (e) {
      if (destroyed) return;
      if (e instanceof ApiError && e.status === 404) {
        clear(main).append(h('h1', {}, 'Session not found'),
          h('p', { class: 'empty' }, `There is no session ${id} in your tenant.`),
          h('p', {}, h('a', { href: '#/inbox' }, 'Back to the inbox')));
      } else {
        errorEl.textContent = e.message;
      }
    }
  })();
  main.focus();

  return {
    destroy() {
      destroyed = true;
      stream?.close();
      unsubscribeStore();
      unsubscribeFeed();
      clearTimeout(treeTimer);
      clearTimeout(confirmTimer);
      for (const el of cards.values()) unwatchClocks(el);
    },
  };
}
