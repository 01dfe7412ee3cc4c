// Test harness for `shardlm serve`: makes a tiny synthetic model, starts
// servers on free ports, waits for /health, scrapes /metrics, and makes sure
// every server it started is killed when the test process ends, even on
// failure or timeout.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

export const CLI = process.env.SHARDLM_CLI;
export const BINARY_DIR = process.env.SHARDLM_BINARY_DIR;
if (!CLI || !BINARY_DIR) {
  throw new Error('set SHARDLM_CLI (the shardlm binary) and SHARDLM_BINARY_DIR (the build dir); ctest sets both');
}

// The official client, installed by setup_openai.sh (ctest fixture).
export async function loadOpenAI() {
  const entry = path.join(BINARY_DIR, '.cache', 'openai-client', 'node_modules', 'openai', 'index.mjs');
  if (!fs.existsSync(entry)) {
    throw new Error(`${entry} is missing: run the openai_client_setup test first (ctest -R openai) to npm-install openai@^6`);
  }
  const mod = await import(pathToFileURL(entry).href);
  return mod.default ?? mod.OpenAI;
}

const servers = new Set();
function killAll(signal = 'SIGKILL') {
  for (const s of servers) {
    try { s.proc.kill(signal); } catch { /* already gone */ }
  }
}
process.on('exit', () => killAll());
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { killAll(); process.exit(1); });

// Kill the servers and fail loudly shortly before ctest's TIMEOUT would
// kill this process and orphan them.
export function watchdog(seconds) {
  setTimeout(() => {
    console.error(`watchdog: the test ran past ${seconds}s; killing the servers`);
    killAll();
    process.exit(1);
  }, seconds * 1000).unref();
}

export function tempDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// A tiny Qwen2.5-shaped model: fast enough for hundreds of requests on 2 cores.
export function makeModel(dir) {
  const args = ['make-model', '--like', 'qwen2.5-0.5b', '--layers', '2', '--vocab', '2048',
                '--hidden', '128', '--intermediate', '256', '--heads', '4', '--kv-heads', '2',
                '--dtype', 'f32', '--out', dir];
  const r = spawnSync(CLI, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`shardlm ${args.join(' ')} failed (${r.status}):\n${r.stdout}\n${r.stderr}`);
  return dir;
}

export function freePort(host = '127.0.0.1') {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.on('error', reject);
    srv.listen(0, host, () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Starts `shardlm serve MODEL --port P ARGS...` and waits until GET /health
// answers 200. `connectHost` is where the test connects (default 127.0.0.1).
export async function startServer(model, args = [], { connectHost = '127.0.0.1', healthTimeoutMs = 60000 } = {}) {
  const port = await freePort(connectHost);
  const argv = ['serve', model, '--port', String(port), ...args];
  // On a busy machine (more runnable threads than cores) libgomp's default
  // active wait makes engine steps stall for seconds at random; passive
  // waiting keeps the test's timing meaningful. Set OMP_WAIT_POLICY to override.
  const env = { OMP_WAIT_POLICY: 'passive', ...process.env };
  const proc = spawn(CLI, argv, { stdio: ['ignore', 'pipe', 'pipe'], env });
  const server = {
    proc, port, argv,
    baseURL: `http://${connectHost}:${port}`,
    output: '',
    exit: null,  // {code, signal} once exited
  };
  server.exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      server.exit = { code, signal };
      servers.delete(server);
      resolve(server.exit);
    });
  });
  proc.stdout.on('data', (d) => { server.output += d; });
  proc.stderr.on('data', (d) => { server.output += d; });
  servers.add(server);
  server.log = () => server.output.split('\n').slice(-40).join('\n');
  server.stop = async (signal = 'SIGTERM', waitMs = 10000) => {
    if (server.exit) return server.exit;
    proc.kill(signal);
    const timer = sleep(waitMs).then(() => null);
    const exit = await Promise.race([server.exited, timer]);
    if (!exit) { proc.kill('SIGKILL'); await server.exited; }
    return exit;  // null: it had to be killed
  };

  const deadline = Date.now() + healthTimeoutMs;
  for (;;) {
    if (server.exit) {
      throw new Error(`shardlm ${argv.join(' ')} exited (${JSON.stringify(server.exit)}) before /health was 200:\n${server.log()}`);
    }
    try {
      const r = await fetch(`${server.baseURL}/health`, { signal: AbortSignal.timeout(2000) });
      if (r.status === 200) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      await server.stop('SIGKILL');
      throw new Error(`shardlm ${argv.join(' ')}: no 200 from /health within ${healthTimeoutMs} ms:\n${server.log()}`);
    }
    await sleep(100);
  }
  return server;
}

// GET /metrics -> {name: value}, summed over label sets (e.g. model_name).
export async function scrapeMetrics(baseURL) {
  const r = await fetch(`${baseURL}/metrics`);
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}`);
  const out = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!m) continue;
    const value = Number(m[3]);
    out[m[1]] = (out[m[1]] ?? 0) + value;
  }
  return out;
}

// Polls /metrics until pred(metrics) holds; returns the last scrape and
// whether it held within timeoutMs.
export async function waitForMetrics(baseURL, pred, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  let m;
  for (;;) {
    m = await scrapeMetrics(baseURL);
    if (pred(m)) return { ok: true, metrics: m };
    if (Date.now() > deadline) return { ok: false, metrics: m };
    await sleep(50);
  }
}

export async function postJson(baseURL, route, body, headers = {}) {
  const r = await fetch(`${baseURL}${route}`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, text, json };
}
