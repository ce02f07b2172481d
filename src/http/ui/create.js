// New session: pick an agent, optionally a title, write the prompt.

import { api } from './api.js';
import { h, nextId } from './dom.js';

export function renderCreate(main, ctx) {
  if (ctx.may && !ctx.may.write) {
    main.append(h('h1', {}, 'New session'),
      h('p', { class: 'empty' }, 'Your token cannot start sessions: that needs sessions:write.'));
    return { destroy() {} };
  }
  let destroyed = false;
  const agentId = nextId('agent');
  const titleId = nextId('title');
  const promptId = nextId('prompt');
  const agentHelpId = `${agentId}-help`;
  const select = h('select', { id: agentId, required: true, 'aria-describedby': agentHelpId });
  const agentHelp = h('p', { id: agentHelpId, class: 'hint' });
  const titleInput = h('input', { id: titleId, type: 'text', autocomplete: 'off', maxlength: '512' });
  const prompt = h('textarea', { id: promptId, class: 'prose', rows: '5', required: true });
  const error = h('p', { class: 'error', role: 'alert' });
  const start = h('button', { type: 'submit', class: 'primary', disabled: true }, 'Start session');
  const form = h('form', { class: 'create', 'aria-labelledby': 'create-title', novalidate: true },
    h('h1', { id: 'create-title' }, 'New session'),
    h('label', { for: agentId }, 'Agent'), select, agentHelp,
    h('label', { for: titleId }, 'Title (optional)'), titleInput,
    h('label', { for: promptId }, 'Prompt'), prompt,
    error,
    h('div', { class: 'form-actions' }, start));
  main.append(form);

  let agents = [];
  function describe() {
    const a = agents.find((x) => x.name === select.value);
    if (!a) return;
    const tools = (a.tool_specs || []).map((t) => `${t.name}${t.requires_approval ? ' (asks)' : ''}`);
    agentHelp.textContent = [
      `Approval: ${a.approval}.`,
      tools.length ? `Tools: ${tools.join(', ')}.` : 'No tools.',
      a.subagents && a.subagents.length ? `Delegates to: ${a.subagents.join(', ')}.` : '',
    ].filter(Boolean).join(' ');
  }
  select.addEventListener('change', describe);

  (async () => {
    try {
      const answer = await api('GET', '/v1/agents');
      if (destroyed) return;
      agents = answer.agents || [];
      for (const a of agents) select.append(h('option', { value: a.name }, a.name));
      start.disabled = agents.length === 0;
      describe();
      select.focus();
    } catch (e) {
      if (!destroyed) error.textContent = e.message;
    }
  })();

  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.textContent = '';
    const text = prompt.value.trim();
    if (!text) {
      error.textContent = 'Write a prompt: it is the first message of the session.';
      prompt.setAttribute('aria-invalid', 'true');
      prompt.focus();
      return;
    }
    prompt.removeAttribute('aria-invalid');
    const body = { agent: select.value, prompt: text };
    const title = titleInput.value.trim();
    if (title) body.title = title;
    start.disabled = true;
    try {
      const session = await api('POST', '/v1/sessions', body);
      ctx.navigate(`#/s/${session.id}`);
    } catch (e) {
      error.textContent = e.message;
      start.disabled = false;
    }
  });

  return { destroy() { destroyed = true; } };
}
