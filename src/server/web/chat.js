// The chat tab: streamed replies from POST /v1/chat/completions (SSE read
// from fetch's ReadableStream), a stop button (AbortController), the system
// prompt and sampling settings, reasoning collapsed, tool calls shown as
// such, history in localStorage.
import { apiFetch, h } from './api.js';
import { renderMarkdown } from './markdown.js';

const HISTORY = 'shardlm-chat-history';
const SETTINGS = 'shardlm-chat-settings';

const $ = (id) => document.getElementById(id);
let model = '';
let messages = [];      // [{role, content, reasoning?, tool_calls?, stopped?, error?}]
let controller = null;  // the request in flight

export function setChatModel(name) { model = name; }

export function initChat() {
  try { messages = JSON.parse(localStorage.getItem(HISTORY) || '[]'); } catch (_) { messages = []; }
  if (!Array.isArray(messages)) messages = [];
  loadSettings();
  for (const m of messages) $('messages').append(messageView(m).el);
  scrollDown();

  $('chat-form').addEventListener('submit', (e) => { e.preventDefault(); send(); });
  $('chat-input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); send(); }
  });
  $('chat-stop').addEventListener('click', () => { if (controller) controller.abort(); });
  $('new-chat').addEventListener('click', () => {
    if (controller) controller.abort();
    messages = [];
    saveHistory();
    $('messages').replaceChildren();
    status('');
  });
  for (const id of ['system-prompt', 'temperature', 'top-p', 'max-tokens', 'extra-body'])
    $(id).addEventListener('change', saveSettings);
}

function loadSettings() {
  let s = {};
  try { s = JSON.parse(localStorage.getItem(SETTINGS) || '{}') || {}; } catch (_) { s = {}; }
  if (typeof s.system === 'string') $('system-prompt').value = s.system;
  if (s.temperature !== undefined) $('temperature').value = s.temperature;
  if (s.top_p !== undefined) $('top-p').value = s.top_p;
  if (s.max_tokens !== undefined) $('max-tokens').value = s.max_tokens;
  if (typeof s.extra === 'string') $('extra-body').value = s.extra;
}

function saveSettings() {
  localStorage.setItem(SETTINGS, JSON.stringify({
    system: $('system-prompt').value, temperature: $('temperature').value, top_p: $('top-p').value,
    max_tokens: $('max-tokens').value, extra: $('extra-body').value,
  }));
}

function saveHistory() {
  try { localStorage.setItem(HISTORY, JSON.stringify(messages)); } catch (_) { /* quota: keep going */ }
}

function status(text) { $('chat-status').textContent = text; }
function scrollDown() { const m = $('messages'); m.scrollTop = m.scrollHeight; }

// One message's DOM, with update() to redraw it as it streams.
function messageView(m) {
  const el = h('div', { class: 'msg ' + m.role, testid: m.role === 'user' ? 'chat-message-user' : 'chat-message-assistant' });
  const who = h('div', { class: 'who', text: m.role === 'user' ? 'You' : 'Assistant' });
  const reasoning = h('details', { class: 'reasoning', testid: 'chat-reasoning', hidden: true },
                      h('summary', { text: 'Reasoning' }), h('div', { class: 'reasoning-body' }));
  const tools = h('div', { class: 'tool-calls', hidden: true });
  const body = h('div', { class: 'content' });
  const note = h('div', { class: 'note', hidden: true });
  el.append(who, reasoning, tools, body, note);
  const update = () => {
    if (m.reasoning) {
      reasoning.hidden = false;
      reasoning.querySelector('.reasoning-body').textContent = m.reasoning;
    }
    if (m.tool_calls && m.tool_calls.length) {
      tools.hidden = false;
      tools.replaceChildren(...m.tool_calls.map((t) => h('div', { class: 'tool-call', testid: 'chat-tool-call' },
        h('div', { class: 'tool-name' }, 'tool call ', h('code', { text: (t.function && t.function.name) || '?' })),
        h('pre', { class: 'code', text: prettyArguments(t.function && t.function.arguments) }))));
    }
    if (m.role === 'user') body.textContent = m.content || '';
    else body.replaceChildren(renderMarkdown(m.content || ''));
    const notes = [];
    if (m.stopped) notes.push('stopped');
    if (m.finish_reason && m.finish_reason !== 'stop') notes.push('finish: ' + m.finish_reason);
    if (m.error) notes.push(m.error);
    note.hidden = !notes.length;
    note.textContent = notes.join(' · ');
    note.classList.toggle('error-text', !!m.error);
  };
  update();
  return { el, update };
}

function prettyArguments(args) {
  if (typeof args !== 'string') return '';
  try { return JSON.stringify(JSON.parse(args), null, 2); } catch (_) { return args; }
}

function requestBody() {
  const body = { messages: [], stream: true, stream_options: { include_usage: true } };
  if (model) body.model = model;
  const system = $('system-prompt').value.trim();
  if (system) body.messages.push({ role: 'system', content: system });
  for (const m of messages) {
    if (m.error && !m.content) continue;
    const msg = { role: m.role, content: m.content || '' };
    if (m.tool_calls && m.tool_calls.length) msg.tool_calls = m.tool_calls;
    body.messages.push(msg);
  }
  const num = (id) => { const v = $(id).value.trim(); return v === '' ? undefined : Number(v); };
  body.temperature = num('temperature');
  body.top_p = num('top-p');
  body.max_tokens = num('max-tokens');
  const extra = $('extra-body').value.trim();
  $('extra-error').textContent = '';
  if (extra) {
    let parsed;
    try { parsed = JSON.parse(extra); } catch (e) { throw new Error('Extra request fields: not JSON: ' + e.message); }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('Extra request fields: give a JSON object');
    Object.assign(body, parsed);
  }
  return body;
}

async function send() {
  const input = $('chat-input');
  const text = input.value;
  if (!text.trim() || controller) return;
  let body;
  messages.push({ role: 'user', content: text });
  try {
    body = requestBody();
  } catch (e) {
    messages.pop();
    $('extra-error').textContent = e.message;
    return;
  }
  input.value = '';
  $('messages').append(messageView(messages[messages.length - 1]).el);
  const reply = { role: 'assistant', content: '', reasoning: '', tool_calls: [] };
  messages.push(reply);
  const view = messageView(reply);
  view.el.classList.add('streaming');
  $('messages').append(view.el);
  scrollDown();
  saveHistory();

  controller = new AbortController();
  $('chat-send').disabled = true;
  $('chat-stop').disabled = false;
  status('waiting for the first token…');
  const t0 = performance.now();
  let tFirst = 0, nChunks = 0, usage = null, pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => { pending = false; view.update(); scrollDown(); });
  };
  try {
    const res = await apiFetch('/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: controller.signal,
    });
    await readEvents(res.body, (event) => {
      if (event.error) throw new Error(event.error.message || 'the server reported an error');
      if (event.usage) usage = event.usage;
      for (const choice of event.choices || []) {
        if (choice.index && choice.index !== 0) continue;
        const d = choice.delta || {};
        if (typeof d.content === 'string' && d.content) reply.content += d.content;
        if (typeof d.reasoning_content === 'string' && d.reasoning_content) reply.reasoning += d.reasoning_content;
        for (const t of d.tool_calls || []) mergeToolCall(reply.tool_calls, t);
        if (choice.finish_reason) reply.finish_reason = choice.finish_reason;
      }
      if (!tFirst && (reply.content || reply.reasoning || reply.tool_calls.length)) tFirst = performance.now();
      ++nChunks;
      status(`streaming… ${nChunks} chunks`);
      redraw();
    });
    const secs = (performance.now() - t0) / 1000;
    const n = usage ? usage.completion_tokens : nChunks;
    status(`${n} tokens in ${secs.toFixed(2)} s` + (tFirst ? ` · first token after ${((tFirst - t0) / 1000).toFixed(2)} s` : '') +
           (reply.finish_reason ? ` · finish: ${reply.finish_reason}` : ''));
  } catch (e) {
    if (e.name === 'AbortError') {
      reply.stopped = true;
      status('stopped');
    } else {
      reply.error = e.message;
      status('error');
    }
  } finally {
    controller = null;
    $('chat-send').disabled = false;
    $('chat-stop').disabled = true;
    view.el.classList.remove('streaming');
    view.update();
    saveHistory();
    scrollDown();
  }
}

function mergeToolCall(calls, t) {
  const i = typeof t.index === 'number' ? t.index : calls.length;
  calls[i] = calls[i] || { id: '', type: 'function', function: { name: '', arguments: '' } };
  const c = calls[i];
  if (t.id) c.id = t.id;
  if (t.type) c.type = t.type;
  if (t.function) {
    if (t.function.name) c.function.name += t.function.name;
    if (t.function.arguments) c.function.arguments += t.function.arguments;
  }
}

// Server-sent events from a fetch body: calls onEvent with each JSON payload
// until [DONE] or the end of the stream.
async function readEvents(stream, onEvent) {
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let m;
      while ((m = /\r?\n\r?\n/.exec(buffer))) {
        const block = buffer.slice(0, m.index);
        buffer = buffer.slice(m.index + m[0].length);
        const data = block.split(/\r?\n/).filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trimStart()).join('\n');
        if (!data) continue;
        if (data === '[DONE]') return;
        onEvent(JSON.parse(data));
      }
    }
  } finally {
    reader.releaseLock();
  }
}
