// The bearer token: kept in sessionStorage (this tab only, gone when it
// closes), never in a URL the page requests and never in persistent storage.
// `overseer token --url` hands a token over in the URL fragment (#token=…),
// which browsers never send to the server; the page moves it into
// sessionStorage and strips it from the address bar and the history entry.

const KEY = 'overseer.token';

/** Moves a token handed over in the fragment into sessionStorage. Returns
 *  whether there was one. */
export function takeTokenFromFragment() {
  const hash = window.location.hash;
  if (!hash.startsWith('#token=')) return false;
  const token = decodeURIComponent(hash.slice('#token='.length)).trim();
  history.replaceState(null, '', window.location.pathname + window.location.search);
  if (token) setToken(token);
  return Boolean(token);
}

export function getToken() {
  return sessionStorage.getItem(KEY);
}

export function setToken(token) {
  sessionStorage.setItem(KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
}

/** The token's claims, for display and for the expiry timer only: the
 *  server verifies the token, the page trusts nothing it reads here. */
export function claims(token) {
  try {
    const part = token.split('.')[1];
    const b64 = part.replace(/-/g, '+').replace(/_/g, '/');
    const padded = b64 + '='.repeat((4 - (b64.length % 4)) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    const value = JSON.parse(new TextDecoder().decode(bytes));
    return value && typeof value === 'object' ? value : {};
  } catch {
    return {};
  }
}
