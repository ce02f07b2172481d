// The API client: JSON requests with the bearer token in the Authorization
// header (never in the URL), and Server-Sent Event streams read with fetch
// (EventSource cannot send headers), reconnecting with Last-Event-ID.

import { getToken } from './auth.js';
import { display } from './render.js';

/** A refused request: HTTP status and the API's {error: {code, message}}. */
export class ApiError extends Error {
  constructor(status, code, message, details) {
    // Shown as it is by the views; it may quote what the caller sent.
    super(display(message, false));
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

let unauthorized = () => {};

/** Who is told about a 401 (the app returns to sign-in). */
export function onUnauthorized(handler) {
  unauthorized = handler;
}

async function errorOf(response) {
  try {
    const body = await response.json();
    const e = body && body.error;
    if (e && typeof e.message === 'string') {
      return new ApiError(response.status, String(e.code || 'error'), e.message, e.details);
    }
  } catch {
    // not JSON
  }
  return new ApiError(response.status, 'error', `the server answered ${response.status}`);
}

function headers(extra = {}) {
  const token = getToken();
  if (!token) throw new ApiError(401, 'unauthorized', 'not signed in');
  return { Authorization: `Bearer ${token}`, ...extra };
}

/** Calls the API; resolves with the JSON answer, rejects with an ApiError.
 *  A 401 also calls the unauthorized handler. */
export async function api(method, path, body) {
  const init = {
    method,
    headers: headers(body === undefined ? {} : { 'Content-Type': 'application/json' }),
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
    credentials: 'omit',
    referrerPolicy: 'no-referrer',
  };
  let response;
  try {
    response = await fetch(path, init);
  } catch {
    throw new ApiError(0, 'network', 'the server cannot be reached');
  }
  if (response.status === 401) {
    const e = await errorOf(response);
    unauthorized(e.message);
    throw e;
  }
  if (!response.ok) throw await errorOf(response);
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A Server-Sent Event stream that reconnects (with Last-Event-ID) until
 *  closed. `handlers.event(type, data, id)` gets each event;
 *  `handlers.state('live' | 'reconnecting')` the connection's state. */
export class EventStream {
  constructor(path, handlers, lastId = null) {
    this.path = path;
    this.handlers = handlers;
    this.lastId = lastId;
    this.closed = false;
    this.controller = new AbortController();
    this.run();
  }

  close() {
    this.closed = true;
    this.controller.abort();
  }

  async run() {
    let delay = 500;
    while (!this.closed) {
      try {
        const extra = { Accept: 'text/event-stream' };
        if (this.lastId !== null) extra['Last-Event-ID'] = String(this.lastId);
        const response = await fetch(this.path, {
          headers: headers(extra),
          cache: 'no-store',
          credentials: 'omit',
          referrerPolicy: 'no-referrer',
          signal: this.controller.signal,
        });
        if (response.status === 401) {
          const e = await errorOf(response);
          this.closed = true;
          unauthorized(e.message);
          return;
        }
        if (!response.ok) throw await errorOf(response);
        this.state('live');
        delay = 500;
        await this.read(response.body);
      } catch (e) {
        if (this.closed) return;
        if (e instanceof ApiError && e.status === 404) {
          this.closed = true;
          this.handlers.gone?.(e);
          return;
        }
      }
      if (this.closed) return;
      this.state('reconnecting');
      await sleep(delay);
      delay = Math.min(delay * 2, 10000);
    }
  }

  state(s) {
    this.handlers.state?.(s);
  }

  async read(body) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done || this.closed) return;
      buffer += value.replace(/\r\n?/g, '\n');
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        this.dispatch(block);
      }
    }
  }

  dispatch(block) {
    let id = null;
    let type = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (!line || line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'id') id = value;
      else if (field === 'event') type = value;
      else if (field === 'data') data.push(value);
    }
    if (id === null && data.length === 0) return;
    if (id !== null) this.lastId = id;
    let parsed = null;
    try {
      parsed = JSON.parse(data.join('\n'));
    } catch {
      return;
    }
    if (this.closed) return;
    this.handlers.event(type, parsed, id);
  }
}
