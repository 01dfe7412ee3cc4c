// Every call the page makes goes through here: same origin only, the API key
// (when one was given) from sessionStorage as a Bearer token. A 401 asks for
// the key (the 'shardlm:need-key' event) and rejects.
const KEY = 'shardlm-api-key';

export function apiKey() { return sessionStorage.getItem(KEY) || ''; }
export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function apiFetch(path, options = {}) {
  if (!path.startsWith('/')) throw new Error('same-origin paths only: ' + path);
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set('Authorization', 'Bearer ' + key);
  const res = await fetch(path, { ...options, headers, credentials: 'omit', cache: 'no-store' });
  if (res.status === 401) {
    window.dispatchEvent(new CustomEvent('shardlm:need-key', { detail: { hadKey: !!key } }));
    throw new ApiError(401, await errorMessage(res));
  }
  if (!res.ok) throw new ApiError(res.status, await errorMessage(res));
  return res;
}

async function errorMessage(res) {
  try {
    const body = await res.json();
    if (body && body.error && body.error.message) return `${res.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `HTTP ${res.status}`;
}

export async function apiJson(path, options) { return (await apiFetch(path, options)).json(); }

// Number formatting shared by the tabs.
export function withCommas(n) { return Math.round(n).toLocaleString('en-US'); }

// Bytes in a binary unit, precise to better than 1% (4 significant digits:
// 0.4% at worst), never "0.001 GiB".
export function formatBytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = Math.abs(n), u = 0;
  while (v >= 1024 && u < units.length - 1) { v /= 1024; ++u; }
  const text = u === 0 ? String(Math.round(v)) : v.toPrecision(4);
  return (n < 0 ? '-' : '') + text + ' ' + units[u];
}

// An element with attributes and children (strings become text nodes:
// nothing here ever parses HTML).
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k === 'testid') el.dataset.testid = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
  return el;
}
