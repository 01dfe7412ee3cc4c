// Issue 26: the agent APIs of `shardlm serve` under the real clients that
// speak them, on Node 22 (installed by the api_clients fixture):
//   @anthropic-ai/sdk   messages.create, messages.stream, a forced tool_use
//                       whose input validates against its schema, countTokens
//   @ai-sdk/anthropic   generateText, streamText (with the `ai` package)
//   openai              responses.create, responses.stream with a forced
//                       function call, text.format structured output,
//                       previous_response_id, retrieve / delete
// Random weights never choose to call a tool, so calls are forced
// (tool_choice tool / function: the grammar engine writes them) and their
// arguments use enums, which keeps them short.
//
//   ctest -R api_agents   (installs the clients first)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { BINARY_DIR, makeModel, startServer, tempDir, watchdog } from '../openai/harness.mjs';

watchdog(170);  // ctest TIMEOUT is 180 s

const MODEL = 'tiny-qwen';
const API_KEY = 'sk-agents';
const modules = path.join(BINARY_DIR, '.cache', 'api-clients', 'node_modules');
async function load(name, entry) {
  const file = path.join(modules, name, entry);
  if (!fs.existsSync(file)) throw new Error(`${file} is missing: run the api_clients_setup test first (ctest -R api_clients)`);
  return import(pathToFileURL(file).href);
}
function packageEntry(name) {
  const pkg = JSON.parse(fs.readFileSync(path.join(modules, name, 'package.json'), 'utf8'));
  const exp = pkg.exports?.['.'];
  const pick = (e) => (typeof e === 'string' ? e : e?.import?.default ?? e?.import ?? e?.default ?? e?.node?.import);
  let entry = pick(exp);
  if (typeof entry === 'object') entry = pick(entry);
  return entry ?? pkg.module ?? pkg.main;
}

let work, server, anthropic, openai;

before(async () => {
  work = tempDir('shardlm-agents-');
  const model = makeModel(path.join(work, 'model'));
  server = await startServer(model, ['--served-model-name', MODEL, '--max-model-len', '1024',
    '--kv-cache-memory', String(64 << 20), '--tool-call-parser', 'hermes', '--api-key', API_KEY]);
  const Anthropic = (await load('@anthropic-ai/sdk', packageEntry('@anthropic-ai/sdk'))).default;
  anthropic = new Anthropic({ baseURL: server.baseURL, apiKey: API_KEY, maxRetries: 0, timeout: 30000 });
  const OpenAI = (await load('openai', packageEntry('openai'))).default;
  openai = new OpenAI({ baseURL: `${server.baseURL}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 30000 });
});

after(async () => {
  if (server) await server.stop('SIGKILL');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const weatherSchema = { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } },
  required: ['city'], additionalProperties: false };
// What a forced call's input must be: exactly the schema's object.
function assertWeatherInput(input) {
  assert.deepEqual(Object.keys(input), ['city'], JSON.stringify(input));
  assert.ok(['Paris', 'Rome'].includes(input.city), JSON.stringify(input));
}
const replySchema = { type: 'object', additionalProperties: false, required: ['answer', 'n'],
  properties: { answer: { type: 'string', enum: ['yes', 'no'] }, n: { type: 'integer', minimum: 0, maximum: 9 } } };

test('@anthropic-ai/sdk: messages.create and messages.stream give the same greedy text', async () => {
  const params = { model: MODEL, max_tokens: 8, temperature: 0, system: 'Be brief.', messages: [{ role: 'user', content: 'Hello' }] };
  const m = await anthropic.messages.create(params);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.ok(['max_tokens', 'end_turn'].includes(m.stop_reason), m.stop_reason);
  assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0, JSON.stringify(m.usage));
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

  const events = [];
  const stream = anthropic.messages.stream(params);
  stream.on('streamEvent', (e) => events.push(e.type));
  let streamed = '';
  stream.on('text', (t) => { streamed += t; });
  const final = await stream.finalMessage();
  assert.equal(streamed, text, 'streamed = created');
  assert.equal(final.stop_reason, m.stop_reason);
  assert.equal(final.usage.output_tokens, m.usage.output_tokens);
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-2), 'message_delta');
  assert.equal(events.at(-1), 'message_stop');
});

test('@anthropic-ai/sdk: a forced tool_use (create and stream) has input valid against its schema', async () => {
  const tools = [{ name: 'get_weather', description: 'Current weather in a city', input_schema: weatherSchema }];
  const params = { model: MODEL, max_tokens: 200, temperature: 0, tools, tool_choice: { type: 'tool', name: 'get_weather' },
    messages: [{ role: 'user', content: 'Weather?' }] };
  const m = await anthropic.messages.create(params);
  assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m));
  const use = m.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(m.content));
  assert.equal(use.name, 'get_weather');
  assert.match(use.id, /^toolu_/);
  assertWeatherInput(use.input);

  const stream = anthropic.messages.stream({ ...params, tool_choice: { type: 'any' } });
  let json = '';
  stream.on('inputJson', (delta) => { json += delta; });
  const final = await stream.finalMessage();
  const streamedUse = final.content.find((b) => b.type === 'tool_use');
  assert.ok(streamedUse, JSON.stringify(final.content));
  assertWeatherInput(streamedUse.input);
  assert.deepEqual(JSON.parse(json), streamedUse.input);
  assert.equal(final.stop_reason, 'tool_use');

  // The result goes back as a tool_result block; the answer continues.
  const next = await anthropic.messages.create({ model: MODEL, max_tokens: 4, temperature: 0, tools,
    messages: [...params.messages, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] }] });
  assert.ok(next.usage.input_tokens + next.usage.cache_read_input_tokens > m.usage.input_tokens + m.usage.cache_read_input_tokens);
});

test('@anthropic-ai/sdk: countTokens counts the prompt that create is charged for; errors are typed', async () => {
  const params = { model: MODEL, system: 'Count me.', messages: [{ role: 'user', content: 'How many tokens is this?' }] };
  const counted = await anthropic.messages.countTokens(params);
  const m = await anthropic.messages.create({ ...params, max_tokens: 1 });
  assert.equal(counted.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  await assert.rejects(anthropic.messages.create({ ...params, max_tokens: 4, thinking: { type: 'enabled', budget_tokens: 1024 } }),
    (e) => e.status === 400 && e.error?.error?.type === 'invalid_request_error' && /budget_tokens/.test(e.message));
  const Anthropic = anthropic.constructor;
  const wrongKey = new Anthropic({ baseURL: server.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrongKey.messages.create({ ...params, max_tokens: 1 }), (e) => e.status === 401 && e.error?.error?.type === 'authentication_error');
});

test('ai + @ai-sdk/anthropic: generateText and streamText', async () => {
  const ai = await load('ai', packageEntry('ai'));
  const { createAnthropic } = await load('@ai-sdk/anthropic', packageEntry('@ai-sdk/anthropic'));
  const provider = createAnthropic({ baseURL: `${server.baseURL}/v1`, apiKey: API_KEY });
  const model = provider(MODEL);
  const opts = { model, system: 'Be brief.', prompt: 'Hello', temperature: 0, maxOutputTokens: 6, maxRetries: 0 };
  const g = await ai.generateText(opts);
  assert.equal(typeof g.text, 'string');
  assert.ok(['length', 'stop'].includes(g.finishReason), g.finishReason);
  assert.ok(g.usage.outputTokens > 0, JSON.stringify(g.usage));
  const s = ai.streamText(opts);
  let text = '';
  for await (const part of s.textStream) text += part;
  assert.equal(text, g.text, 'streamed = generated');
  assert.equal(await s.finishReason, g.finishReason);
});

test('openai: responses.create and previous_response_id; retrieve and delete the stored response', async () => {
  const r = await openai.responses.create({ model: MODEL, instructions: 'Be brief.', input: 'Hello', max_output_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0, JSON.stringify(r.usage));
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');

  const next = await openai.responses.create({ model: MODEL, previous_response_id: r.id, input: 'And then?', max_output_tokens: 2, temperature: 0 });
  assert.ok(next.usage.input_tokens > r.usage.input_tokens, 'the continuation carries the earlier turn');
  // Its cached prefix is the earlier prompt (same tokens, served by the prefix cache).
  assert.equal(typeof next.usage.input_tokens_details.cached_tokens, 'number');

  const got = await openai.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text, r.output_text);
  const deleted = await openai.responses.delete(r.id);
  assert.ok(deleted === undefined || deleted === null || deleted.deleted === true, JSON.stringify(deleted));
  await assert.rejects(openai.responses.retrieve(r.id), (e) => e.status === 404);
  await assert.rejects(openai.responses.create({ model: MODEL, previous_response_id: r.id, input: 'x', max_output_tokens: 1 }),
    (e) => e.status === 404 && e.param === 'previous_response_id');
});

test('openai: responses.stream with a forced function call', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Current weather in a city', strict: true, parameters: weatherSchema }];
  const stream = openai.responses.stream({ model: MODEL, input: 'Weather?', tools, tool_choice: { type: 'function', name: 'get_weather' },
    max_output_tokens: 200, temperature: 0 });
  const types = [];
  let args = '';
  for await (const e of stream) {
    types.push(e.type);
    if (e.type === 'response.function_call_arguments.delta') args += e.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(types.includes('response.function_call_arguments.done'), types.join(' '));
  const call = final.output.find((o) => o.type === 'function_call');
  assert.ok(call, JSON.stringify(final.output));
  assert.equal(call.name, 'get_weather');
  assert.equal(call.arguments, args);
  assertWeatherInput(JSON.parse(call.arguments));

  // The call and its output go back as input items.
  const after = await openai.responses.create({ model: MODEL, max_output_tokens: 2, temperature: 0, tools,
    input: [{ role: 'user', content: 'Weather?' }, call, { type: 'function_call_output', call_id: call.call_id, output: 'sunny' }] });
  assert.ok(after.usage.input_tokens > final.usage.input_tokens);
});

test('openai: text.format json_schema gives an object of the schema; built-in tools are refused naming the parameter', async () => {
  const r = await openai.responses.create({ model: MODEL, input: 'Reply.', max_output_tokens: 64, temperature: 0,
    text: { format: { type: 'json_schema', name: 'reply', strict: true, schema: replySchema } } });
  assert.equal(r.status, 'completed', JSON.stringify(r));
  const out = JSON.parse(r.output_text);
  assert.ok(['yes', 'no'].includes(out.answer) && Number.isInteger(out.n) && out.n >= 0 && out.n <= 9, r.output_text);
  await assert.rejects(openai.responses.create({ model: MODEL, input: 'x', tools: [{ type: 'file_search', vector_store_ids: ['vs_1'] }] }),
    (e) => e.status === 400 && e.param === 'tools[0].type');
  await assert.rejects(openai.responses.create({ model: MODEL, input: 'x', background: true }),
    (e) => e.status === 400 && e.param === 'background');
});
