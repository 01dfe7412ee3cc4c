// `shardlm serve` driven by the official OpenAI Node client (openai@^6) and
// by raw fetch for what a client library would never send. Covers the
// end-to-end contract of issue 4: response shapes, streaming, typed errors,
// concurrency, batch invariance, cancellation on disconnect, impatient
// clients, hostile bodies, the default bind address and graceful shutdown.
//
//   SHARDLM_CLI=build/src/cli/shardlm SHARDLM_BINARY_DIR=build node --test tests/integration/openai/
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';

import {
  loadOpenAI, makeModel, postJson, scrapeMetrics, sleep, startServer, tempDir, waitForMetrics, watchdog,
} from './harness.mjs';

watchdog(170);  // ctest TIMEOUT is 180 s

const MODEL_NAME = 'tiny-qwen';
const MAX_MODEL_LEN = 2048;
let OpenAI;
let work;
let model;
let server;   // default options: binds 127.0.0.1
let client;

before(async () => {
  OpenAI = await loadOpenAI();
  work = tempDir('shardlm-openai-');
  model = makeModel(path.join(work, 'model'));
  server = await startServer(model, [
    '--served-model-name', MODEL_NAME, '--max-model-len', String(MAX_MODEL_LEN),
    '--kv-cache-memory', String(128 << 20), '--shutdown-grace-seconds', '0.5',
  ]);
  client = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 30000 });
});

after(async () => {
  if (server) await server.stop('SIGKILL');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const userMessage = (text) => [{ role: 'user', content: text }];
// Greedy, a fixed number of tokens (ignore_eos is vLLM's extension: the
// random model would otherwise stop at arbitrary points).
const greedy = (maxTokens) => ({ temperature: 0, max_tokens: maxTokens, ignore_eos: true });

async function assertServerAnswers(what) {
  assert.equal(server.exit, null, `the server died (${what}): ${JSON.stringify(server.exit)}\n${server.log()}`);
  const h = await fetch(`${server.baseURL}/health`);
  assert.equal(h.status, 200, `/health after ${what}`);
  const r = await client.chat.completions.create({ model: MODEL_NAME, messages: userMessage('still there?'), ...greedy(2) });
  assert.equal(r.usage.completion_tokens, 2, `a request after ${what}`);
}

test('GET /v1/models lists the served model name with its context length', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.deepEqual(ids, [MODEL_NAME]);
  assert.equal(page.data[0].object, 'model');
  assert.equal(page.data[0].max_model_len, MAX_MODEL_LEN);
});

test('/version, /tokenize and /detokenize round-trip', async () => {
  const v = await (await fetch(`${server.baseURL}/version`)).json();
  assert.equal(typeof v.version, 'string');
  const tok = await postJson(server.baseURL, '/tokenize', { model: MODEL_NAME, prompt: 'Hello, world! Καλημέρα' });
  assert.equal(tok.status, 200, tok.text);
  assert.ok(tok.json.tokens.length > 3 && tok.json.count === tok.json.tokens.length, tok.text);
  assert.equal(tok.json.max_model_len, MAX_MODEL_LEN);
  // return_token_strs: the vocabulary strings (byte-level BPE: "Ġ" stands for the space), as vLLM gives them.
  const strs = await postJson(server.baseURL, '/tokenize', {
    model: MODEL_NAME, prompt: 'Hello, world! Καλημέρα', return_token_strs: true,
  });
  assert.equal(strs.status, 200, strs.text);
  assert.deepEqual(strs.json.tokens, tok.json.tokens);
  assert.equal(strs.json.token_strs.length, tok.json.tokens.length, strs.text);
  assert.ok(strs.json.token_strs.some((s) => s.startsWith('\u0120')), strs.text);
  const detok = await postJson(server.baseURL, '/detokenize', { model: MODEL_NAME, tokens: tok.json.tokens });
  assert.equal(detok.status, 200, detok.text);
  assert.equal(detok.json.prompt, 'Hello, world! Καλημέρα');
});

test('chat completion (non-streaming) has the OpenAI shape and usage', async () => {
  const r = await client.chat.completions.create({
    model: MODEL_NAME, messages: [{ role: 'system', content: 'Be brief.' }, ...userMessage('Say hi')], ...greedy(8),
  });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, MODEL_NAME);
  assert.ok(Number.isInteger(r.created) && Math.abs(r.created - Date.now() / 1000) < 60, `created ${r.created}`);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].index, 0);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.ok(r.usage.prompt_tokens > 5, `prompt_tokens ${r.usage.prompt_tokens}`);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  // The prompt is the ChatML rendering, tokenized as /tokenize does it.
  const tok = await postJson(server.baseURL, '/tokenize', {
    model: MODEL_NAME, messages: [{ role: 'system', content: 'Be brief.' }, ...userMessage('Say hi')],
  });
  assert.equal(tok.status, 200, tok.text);
  assert.equal(tok.json.count, r.usage.prompt_tokens);
  // Greedy is deterministic.
  const again = await client.chat.completions.create({
    model: MODEL_NAME, messages: [{ role: 'system', content: 'Be brief.' }, ...userMessage('Say hi')], ...greedy(8),
  });
  assert.equal(again.choices[0].message.content, r.choices[0].message.content);
  // n > 1 gives n choices.
  const many = await client.chat.completions.create({
    model: MODEL_NAME, messages: userMessage('pick'), n: 3, temperature: 1, max_tokens: 4, ignore_eos: true,
  });
  assert.deepEqual(many.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(many.usage.completion_tokens, 12);
});

test('completions accept a string, a list of strings, and token ids', async () => {
  const prompt = 'The capital of France is';
  const one = await client.completions.create({ model: MODEL_NAME, prompt, ...greedy(6), logprobs: 0 });
  assert.match(one.id, /^cmpl-/);
  assert.equal(one.object, 'text_completion');
  assert.equal(one.choices.length, 1);
  assert.equal(typeof one.choices[0].text, 'string');
  assert.equal(one.choices[0].finish_reason, 'length');
  assert.equal(one.choices[0].logprobs.tokens.length, 6);
  assert.equal(one.usage.completion_tokens, 6);

  const tok = await postJson(server.baseURL, '/tokenize', { model: MODEL_NAME, prompt });
  assert.equal(one.usage.prompt_tokens, tok.json.count);

  // The same prompt as token ids generates the same text.
  const ids = await client.completions.create({ model: MODEL_NAME, prompt: tok.json.tokens, ...greedy(6), logprobs: 0 });
  assert.equal(ids.usage.prompt_tokens, tok.json.tokens.length);
  assert.equal(ids.choices[0].text, one.choices[0].text);
  assert.deepEqual(ids.choices[0].logprobs.tokens, one.choices[0].logprobs.tokens);

  // A list of prompts: one choice each, in order; the first matches the single request.
  const list = await client.completions.create({ model: MODEL_NAME, prompt: [prompt, 'Once upon a time'], ...greedy(6) });
  assert.equal(list.choices.length, 2);
  assert.deepEqual(list.choices.map((c) => c.index), [0, 1]);
  assert.equal(list.choices[0].text, one.choices[0].text);
  assert.equal(list.usage.completion_tokens, 12);

  // A list of token-id lists.
  const lists = await client.completions.create({ model: MODEL_NAME, prompt: [tok.json.tokens, [1, 2, 3]], ...greedy(3) });
  assert.equal(lists.choices.length, 2);
  assert.equal(lists.usage.prompt_tokens, tok.json.tokens.length + 3);

  // echo prepends the prompt.
  const echo = await client.completions.create({ model: MODEL_NAME, prompt, ...greedy(4), echo: true });
  assert.ok(echo.choices[0].text.startsWith(prompt), JSON.stringify(echo.choices[0].text));
});

test('streaming chat with include_usage: deltas concatenate to the non-streaming text', async () => {
  const body = { model: MODEL_NAME, messages: userMessage('Tell me a story about a robot'), ...greedy(24) };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let chunks = 0;
  let role = null;
  let finish = null;
  let usage = null;
  const ids = new Set();
  for await (const chunk of stream) {  // the client consumes data: [DONE] itself
    ++chunks;
    ids.add(chunk.id);
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.equal(chunk.model, MODEL_NAME);
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;  // the usage chunk
    assert.equal(usage, null, 'usage only on the last chunk');
    const c = chunk.choices[0];
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(ids.size, 1, 'every chunk carries the same id');
  assert.ok(chunks >= 3, `only ${chunks} chunks`);
  assert.equal(role, 'assistant');
  assert.equal(finish, 'length');
  assert.equal(text, whole.choices[0].message.content);
  // Token counts agree; the later request finds more of its prompt in the prefix cache.
  const counts = ({ prompt_tokens_details, ...rest }) => rest;
  assert.deepEqual(counts(usage), counts(whole.usage));
  assert.ok(usage.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens_details.cached_tokens);
  assert.ok(usage.prompt_tokens_details.cached_tokens <= usage.prompt_tokens);

  // Streaming completions agree too.
  const cbody = { model: MODEL_NAME, prompt: 'Numbers: 1, 2, 3,', ...greedy(16) };
  const cwhole = await client.completions.create(cbody);
  let ctext = '';
  for await (const chunk of await client.completions.create({ ...cbody, stream: true })) ctext += chunk.choices[0]?.text ?? '';
  assert.equal(ctext, cwhole.choices[0].text);
});

test('invalid requests surface as the client\'s typed errors with the right status', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: userMessage('x'), temperature: 3 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name}: ${e}`);
      assert.equal(e.status, 400);
      assert.match(e.message, /temperature/);
      assert.match(e.message, /\b3\b/);
      return true;
    });
  await assert.rejects(
    client.chat.completions.create({ model: MODEL_NAME, messages: userMessage('x'), max_tokens: 5000 }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${e?.constructor?.name}: ${e}`);
      assert.equal(e.status, 400);
      // "maximum context length is 2048 tokens. However, you requested N tokens (P in the messages, 5000 in the completion)"
      assert.match(e.message, /2048/);
      assert.match(e.message, /5000/);
      return true;
    });
  await assert.rejects(
    client.completions.create({ model: MODEL_NAME, prompt: 'x '.repeat(3000), max_tokens: 4 }),
    (e) => e instanceof OpenAI.BadRequestError && /2048/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: userMessage('x'), max_tokens: 2 }),
    (e) => {
      assert.ok(e instanceof OpenAI.NotFoundError, `${e?.constructor?.name}: ${e}`);
      assert.equal(e.status, 404);
      assert.match(e.message, /no-such-model/);
      return true;
    });
  await assertServerAnswers('typed errors');
});

test('24 concurrent requests all succeed; equal greedy prompts give equal answers', async () => {
  const jobs = [];
  for (let i = 0; i < 24; ++i) {
    const prompt = `Request number ${i % 12}: ${'word '.repeat(1 + (i % 12) * 3)}`;
    jobs.push(i % 3 === 0
      ? client.completions.create({ model: MODEL_NAME, prompt, ...greedy(16) }).then((r) => r.choices[0].text)
      : client.chat.completions.create({ model: MODEL_NAME, messages: userMessage(prompt), ...greedy(16) })
        .then((r) => { assert.equal(r.usage.completion_tokens, 16); return r.choices[0].message.content; }));
  }
  const texts = await Promise.all(jobs);
  assert.equal(texts.length, 24);
  for (let i = 0; i < 12; ++i) {
    // i and i + 12 send the same prompt to the same endpoint (i % 3 == (i + 12) % 3).
    assert.equal(texts[i], texts[i + 12], `prompt ${i}: different greedy outputs in one batch`);
  }
});

test('batch invariance: a greedy request gives the same tokens alone and among 32 others', async () => {
  const target = { model: MODEL_NAME, prompt: 'In a hole in the ground there lived a hobbit.', ...greedy(32), logprobs: 0 };
  const alone = await client.completions.create(target);
  const others = (k) => Array.from({ length: 32 }, (_, i) => {
    const body = {
      model: MODEL_NAME, prompt: `${k}/${i} ${'lorem ipsum dolor '.repeat(1 + ((i * 7) % 40))}`,
      temperature: i % 2 ? 0.8 : 0, max_tokens: 8 + ((i * 5) % 48), ignore_eos: true,
    };
    return i % 4 === 0
      ? client.completions.create({ ...body, stream: true }).then(async (s) => { for await (const _ of s); })
      : client.completions.create(body);
  });
  // Together with the others from the start, and joining while they decode.
  const batch1 = others(1);
  const together = await client.completions.create(target);
  await Promise.all(batch1);
  const batch2 = others(2);
  await sleep(30);
  const joining = await client.completions.create(target);
  await Promise.all(batch2);
  for (const [label, r] of [['together', together], ['joining', joining]]) {
    assert.deepEqual(r.choices[0].logprobs.tokens, alone.choices[0].logprobs.tokens, `${label}: tokens differ from the solo run`);
    assert.equal(r.choices[0].text, alone.choices[0].text, label);
  }
});

test('a client that disconnects mid-stream frees its sequence and KV blocks at once', async () => {
  const before = await waitForMetrics(server.baseURL, (m) => m['vllm:num_requests_running'] === 0, 5000);
  assert.ok(before.ok, `requests still running before the test: ${JSON.stringify(before.metrics)}`);
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model: MODEL_NAME, messages: userMessage('Write a very long essay.'), ...greedy(1800), stream: true },
    { signal: controller.signal });
  let chunks = 0;
  let during = null;
  let finish = null;
  try {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      if (++chunks === 3) {
        during = await scrapeMetrics(server.baseURL);
        controller.abort();
      }
    }
  } catch {
    // openai@6 ends an aborted stream with APIUserAbortError or APIConnectionTimeoutError
  }
  assert.equal(finish, null, 'the stream finished before the abort; make it longer');
  assert.ok(chunks >= 3);
  assert.equal(during['vllm:num_requests_running'], 1, `running while streaming: ${JSON.stringify(during)}`);
  assert.ok(during['vllm:kv_cache_usage_perc'] > 0, `KV usage while streaming: ${during['vllm:kv_cache_usage_perc']}`);
  const t0 = Date.now();
  const freed = await waitForMetrics(server.baseURL,
    (m) => m['vllm:num_requests_running'] === 0 && m['vllm:num_requests_waiting'] === 0 && m['vllm:kv_cache_usage_perc'] === 0,
    2000);
  assert.ok(freed.ok, `2 s after the disconnect: running ${freed.metrics['vllm:num_requests_running']}, ` +
    `waiting ${freed.metrics['vllm:num_requests_waiting']}, kv ${freed.metrics['vllm:kv_cache_usage_perc']}`);
  // Far fewer than 1800 tokens were generated for it.
  const generated = freed.metrics['vllm:generation_tokens_total'] - during['vllm:generation_tokens_total'];
  assert.ok(generated < 1000, `${generated} tokens generated after the disconnect (freed after ${Date.now() - t0} ms)`);
});

test('a client that gives up on a non-streaming request frees it too', async () => {
  const before = await scrapeMetrics(server.baseURL);
  assert.equal(before['vllm:num_requests_running'], 0);
  const controller = new AbortController();
  const pending = client.completions.create(
    { model: MODEL_NAME, prompt: 'An endless list:', ...greedy(1800) }, { signal: controller.signal });
  pending.catch(() => {});
  const started = await waitForMetrics(server.baseURL, (m) => m['vllm:num_requests_running'] === 1, 5000);
  assert.ok(started.ok, 'the request never started running');
  controller.abort();
  await assert.rejects(pending);
  const freed = await waitForMetrics(server.baseURL,
    (m) => m['vllm:num_requests_running'] === 0 && m['vllm:kv_cache_usage_perc'] === 0, 2000);
  const generated = freed.metrics['vllm:generation_tokens_total'] - before['vllm:generation_tokens_total'];
  assert.ok(freed.ok, `2 s after the client hung up the request still runs (${generated} of 1800 tokens generated so far)`);
  assert.ok(generated < 1800, `${generated} tokens generated: the abandoned request ran to the end`);
});

test('200 concurrent requests with 100 ms client timeouts leave the server healthy and fast', async () => {
  const start = await scrapeMetrics(server.baseURL);
  const impatient = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 100 });
  const jobs = Array.from({ length: 200 }, async (_, i) => {
    const opts = { signal: AbortSignal.timeout(100) };
    // Long enough that requests nobody cancels would still be running at the end.
    const body = { model: MODEL_NAME, ...greedy(1000) };
    if (i % 2 === 0) {
      const s = await impatient.chat.completions.create({ ...body, messages: userMessage(`impatient ${i}`), stream: true }, opts);
      for await (const _ of s);
    } else {
      await impatient.completions.create({ ...body, prompt: `impatient ${i}` }, opts);
    }
  });
  const results = await Promise.allSettled(jobs);
  const failed = results.filter((r) => r.status === 'rejected').length;
  assert.ok(failed >= 100, `only ${failed} of 200 requests timed out; the test needs them to`);
  for (const r of results) {
    if (r.status === 'rejected') {
      const e = r.reason;
      assert.ok(e instanceof OpenAI.APIConnectionTimeoutError || e instanceof OpenAI.APIUserAbortError ||
                e.name === 'AbortError' || e.name === 'TimeoutError', `unexpected failure: ${e?.constructor?.name}: ${e}`);
    }
  }
  // The next request is fast: the abandoned ones must not hold threads or batch slots.
  const t0 = Date.now();
  const r = await client.chat.completions.create({ model: MODEL_NAME, messages: userMessage('next'), ...greedy(4) });
  const elapsed = Date.now() - t0;
  assert.equal(r.usage.completion_tokens, 4);
  const m = await scrapeMetrics(server.baseURL);
  assert.ok(elapsed < 2000, `the next request took ${elapsed} ms; metrics then: running ${m['vllm:num_requests_running']}, ` +
    `waiting ${m['vllm:num_requests_waiting']}, generated so far ${m['vllm:generation_tokens_total']}`);
  const drained = await waitForMetrics(server.baseURL,
    (x) => x['vllm:num_requests_running'] === 0 && x['vllm:num_requests_waiting'] === 0 && x['vllm:kv_cache_usage_perc'] === 0,
    5000);
  assert.ok(drained.ok, `5 s after the storm: ${JSON.stringify({
    running: drained.metrics['vllm:num_requests_running'], waiting: drained.metrics['vllm:num_requests_waiting'],
    kv: drained.metrics['vllm:kv_cache_usage_perc'] })}`);
  // Abandoned requests are cancelled, not run to their 1000 tokens.
  const generated = drained.metrics['vllm:generation_tokens_total'] - start['vllm:generation_tokens_total'];
  console.log(`storm: ${failed} of 200 timed out; ${generated} tokens generated; next request ${elapsed} ms`);
  assert.ok(generated < 200 * 1000 / 4, `${generated} tokens were generated for 200 abandoned requests`);
  await assertServerAnswers('200 impatient clients');
});

test('malformed and hostile bodies get OpenAI-shaped 4xx errors, never a crash', async () => {
  const chat = { model: MODEL_NAME, messages: userMessage('x'), max_tokens: 2 };
  const cases = [
    ['invalid JSON', '/v1/chat/completions', '{"model": "x", "messages": [', {}],
    ['empty body', '/v1/chat/completions', '', {}],
    ['a JSON list', '/v1/chat/completions', '[1, 2, 3]', {}],
    ['a JSON string', '/v1/completions', '"hello"', {}],
    ['a JSON number', '/v1/completions', '42', {}],
    ['JSON null', '/v1/chat/completions', 'null', {}],
    ['wrong content type', '/v1/chat/completions', JSON.stringify(chat), { 'Content-Type': 'text/plain' }],
    ['form content type', '/v1/completions', 'prompt=hi', { 'Content-Type': 'application/x-www-form-urlencoded' }],
    ['n = 10^9', '/v1/chat/completions', { ...chat, n: 1e9 }, {}],
    ['max_tokens = 10^12', '/v1/chat/completions', { ...chat, max_tokens: 1e12 }, {}],
    ['max_tokens = 2^64', '/v1/completions', '{"prompt": "x", "max_tokens": 18446744073709551616}', {}],
    ['max_tokens = -1', '/v1/completions', { prompt: 'x', max_tokens: -1 }, {}],
    ['10^4 stop strings', '/v1/chat/completions', { ...chat, stop: Array.from({ length: 1e4 }, (_, i) => `s${i}`) }, {}],
    ['a 1 MB stop string', '/v1/chat/completions', { ...chat, stop: 'x'.repeat(1 << 20) }, {}],
    ['10^4 prompts', '/v1/completions', { prompt: Array(1e4).fill('x'), max_tokens: 1 }, {}],
    ['logprobs = 10^6', '/v1/completions', { prompt: 'x', max_tokens: 1, logprobs: 1e6 }, {}],
    ['top_logprobs = 10^6', '/v1/chat/completions', { ...chat, logprobs: true, top_logprobs: 1e6 }, {}],
    ['token id beyond the vocabulary', '/v1/completions', { prompt: [1, 2, 2048], max_tokens: 2 }, {}],
    // The synthetic tokenizer has 659 ids, the model 2048 rows: 1000 is a model token with no text.
    ['token id without a tokenizer entry', '/v1/completions', { prompt: [1, 1000, 2], max_tokens: 2 }, 'any'],
    ['token id 2^31-1', '/v1/completions', { prompt: [2147483647], max_tokens: 2 }, {}],
    ['negative token id', '/v1/completions', { prompt: [1, -5], max_tokens: 2 }, {}],
    ['stop_token_ids beyond the vocabulary', '/v1/completions', { prompt: 'x', max_tokens: 2, stop_token_ids: [99999999] }, 'any'],
    ['messages not a list', '/v1/chat/completions', { messages: 'hello' }, {}],
    ['message without role', '/v1/chat/completions', { messages: [{ content: 'x' }] }, {}],
    ['image content part', '/v1/chat/completions', { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }, {}],
    ['temperature NaN-ish string', '/v1/chat/completions', { ...chat, temperature: 'NaN' }, {}],
    ['nested 100000 deep', '/v1/chat/completions', `{"messages": ${'['.repeat(100000)}${']'.repeat(100000)}}`, {}],
    ['a lone surrogate', '/v1/chat/completions', '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 2}', 'any'],
    ['a 9 MiB body', '/v1/completions', JSON.stringify({ prompt: 'x'.repeat(9 << 20) }), 'may-close'],
  ];
  for (const [label, route, body, headersOrExpect] of cases) {
    const headers = typeof headersOrExpect === 'object' ? headersOrExpect : {};
    let r;
    try {
      r = await postJson(server.baseURL, route, body, headers);
    } catch (e) {
      // A server may answer 413 and close before reading the whole body.
      if (headersOrExpect === 'may-close') continue;
      assert.fail(`${label}: no HTTP answer (${e.cause?.code ?? e}); server ${JSON.stringify(server.exit)}\n${server.log()}`);
    }
    if (headersOrExpect === 'ok') {
      assert.equal(r.status, 200, `${label}: ${r.text}`);
      continue;
    }
    if (headersOrExpect === 'any' && r.status === 200) continue;  // replacing the surrogate is fine too
    assert.ok(r.status >= 400 && r.status < 500, `${label}: status ${r.status}: ${r.text.slice(0, 300)}`);
    assert.ok(r.json && typeof r.json.error === 'object', `${label}: not an OpenAI error body: ${r.text.slice(0, 300)}`);
    assert.equal(typeof r.json.error.message, 'string', label);
    assert.equal(typeof r.json.error.type, 'string', label);
    assert.ok('param' in r.json.error && 'code' in r.json.error, `${label}: ${r.text.slice(0, 300)}`);
    assert.equal(server.exit, null, `${label}: the server exited\n${server.log()}`);
  }
  await assertServerAnswers('hostile bodies');
});

function canConnect(host, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    s.setTimeout(2000);
    s.on('connect', () => { s.destroy(); resolve(true); });
    s.on('error', () => resolve(false));
    s.on('timeout', () => { s.destroy(); resolve(false); });
  });
}

// 127.0.0.2 is loopback on Linux but a different address: a server bound to
// 127.0.0.1 refuses it, one bound to 0.0.0.0 would accept it.
async function have127002() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.on('error', () => resolve(false));
    s.listen(0, '127.0.0.2', () => s.close(() => resolve(true)));
  });
}

test('binds 127.0.0.1 unless --host says otherwise', async () => {
  assert.match(server.output, new RegExp(`listening on http://127\\.0\\.0\\.1:${server.port}\\b`));
  assert.ok(await canConnect('127.0.0.1', server.port));
  if (await have127002()) {
    assert.equal(await canConnect('127.0.0.2', server.port), false, 'the default server accepts connections on 127.0.0.2');
  }
});

test('--api-key: wrong keys are AuthenticationError 401, /health needs none; --host; SIGINT exits 0', async () => {
  const host = (await have127002()) ? '127.0.0.2' : '127.0.0.1';
  const keyed = await startServer(model, ['--served-model-name', MODEL_NAME, '--api-key', 's3cret', '--host', host,
                                          '--kv-cache-memory', String(16 << 20)], { connectHost: host });
  try {
    assert.match(keyed.output, new RegExp(`listening on http://${host.replace(/\./g, '\\.')}:${keyed.port}\\b`));
    if (host !== '127.0.0.1') assert.equal(await canConnect('127.0.0.1', keyed.port), false, '--host 127.0.0.2 also listens on 127.0.0.1');
    const wrong = new OpenAI({ baseURL: `${keyed.baseURL}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(wrong.chat.completions.create({ model: MODEL_NAME, messages: userMessage('x'), max_tokens: 2 }),
      (e) => {
        assert.ok(e instanceof OpenAI.AuthenticationError, `${e?.constructor?.name}: ${e}`);
        assert.equal(e.status, 401);
        return true;
      });
    await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
    const noKey = await postJson(keyed.baseURL, '/v1/completions', { prompt: 'x', max_tokens: 1 });
    assert.equal(noKey.status, 401, noKey.text);
    assert.equal(typeof noKey.json?.error?.message, 'string');
    assert.equal((await fetch(`${keyed.baseURL}/health`)).status, 200);
    const right = new OpenAI({ baseURL: `${keyed.baseURL}/v1`, apiKey: 's3cret', maxRetries: 0 });
    const r = await right.chat.completions.create({ model: MODEL_NAME, messages: userMessage('x'), ...greedy(2) });
    assert.equal(r.usage.completion_tokens, 2);
    assert.equal((await fetch(`${keyed.baseURL}/health`)).status, 200);

    const exit = await keyed.stop('SIGINT', 5000);
    assert.deepEqual(exit, { code: 0, signal: null }, `SIGINT: ${JSON.stringify(exit)}\n${keyed.log()}`);
  } finally {
    await keyed.stop('SIGKILL');
  }
});

test('SIGTERM with a stream in flight: the stream ends and the server exits 0', async () => {
  const stream = await client.chat.completions.create(
    { model: MODEL_NAME, messages: userMessage('A long answer, please.'), ...greedy(1800), stream: true });
  let finish = null;
  let chunks = 0;
  let streamError = null;
  let signalled = null;
  const consumed = (async () => {
    try {
      for await (const chunk of stream) {
        if (++chunks === 2) signalled = server.stop('SIGTERM', 10000);
        if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      }
    } catch (e) {
      streamError = e;
    }
  })();
  const ended = await Promise.race([consumed.then(() => true), sleep(15000).then(() => false)]);
  assert.ok(ended, `the stream did not end within 15 s of SIGTERM (${chunks} chunks)`);
  assert.ok(signalled, 'the stream ended before SIGTERM was sent');
  const exit = await signalled;
  assert.deepEqual(exit, { code: 0, signal: null }, `SIGTERM: ${JSON.stringify(exit)}\n${server.log()}`);
  console.log(`SIGTERM: ${chunks} chunks, finish_reason ${finish}, stream error ${streamError?.message ?? 'none'}`);
  // 1800 tokens take longer than the 0.5 s grace: the server aborts the
  // request and says so (finish_reason "abort", then [DONE]) rather than
  // cutting the connection mid-stream.
  assert.equal(streamError, null, `the stream was cut after ${chunks} chunks instead of ending: ${streamError?.message}`);
  assert.ok(['abort', 'length'].includes(finish), `finish_reason ${finish}`);
});
