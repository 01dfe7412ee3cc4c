// The web page `shardlm serve` serves at /, in a real browser: Debian's
// chromium, headless, driven by puppeteer-core (installed by the ctest
// fixture setup_webui.sh). Two servers on a tiny synthetic model: -tp 3
// without a key, and one with --api-key. Every wait is on an event or a
// condition in the page, never a fixed sleep. Screenshots of each tab go to
// ${SHARDLM_BINARY_DIR}/test-artifacts/webui/.
//   SHARDLM_CLI=build/src/cli/shardlm SHARDLM_BINARY_DIR=build node --test tests/integration/webui/webui.test.mjs
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { tmpdir } from 'node:os';

const cli = process.env.SHARDLM_CLI;
const binDir = process.env.SHARDLM_BINARY_DIR;
assert.ok(cli && binDir, 'set SHARDLM_CLI and SHARDLM_BINARY_DIR');
const require = createRequire(join(binDir, '.cache/webui-browser/package.json'));
const puppeteer = require('puppeteer-core');
const artifacts = join(binDir, 'test-artifacts/webui');
mkdirSync(artifacts, { recursive: true });
const KEY = 'webui-test-key';
const work = mkdtempSync(join(tmpdir(), 'shardlm-webui-'));
const model = join(work, 'model');

// Starts `shardlm serve` on a free port; resolves with its origin once it says it listens.
function serve(args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(cli, ['serve', model, '--port', '0', '--kv-cache-memory', '16MiB', '--served-model-name', 'tiny-demo', ...args],
                       { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    const timer = setTimeout(() => reject(new Error('serve did not start in 60 s:\n' + log)), 60000);
    proc.stderr.on('data', (d) => {
      log += d;
      const m = log.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, origin: m[1], log: () => log }); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`serve exited with ${code}:\n${log}`)); });
  });
}

function stopServer(s) {
  if (!s || s.proc.exitCode !== null) return Promise.resolve();
  return new Promise((resolve) => { s.proc.removeAllListeners('exit'); s.proc.on('exit', resolve); s.proc.kill('SIGTERM'); });
}

let open, keyed, browser;

before(async () => {
  execFileSync(cli, ['make-model', '--like', 'qwen2.5-7b', '--layers', '2', '--vocab', '512', '--hidden', '128', '--heads', '4',
                     '--kv-heads', '2', '--intermediate', '256', '--seed', '1', '--out', model], { stdio: 'ignore' });
  const chromium = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));
  assert.ok(chromium, 'chromium is not installed (scripts/install-deps.sh)');
  [open, keyed, browser] = await Promise.all([
    serve(['-tp', '3']),
    serve(['--api-key', KEY]),
    puppeteer.launch({
      executablePath: chromium, headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--disable-background-networking',
             '--disable-component-update', '--disable-default-apps', '--disable-sync', '--disable-extensions'],
    }),
  ]);
});

after(async () => {
  if (browser) await browser.close();
  await Promise.all([stopServer(open), stopServer(keyed)]);
  rmSync(work, { recursive: true, force: true });
});

// A page that records console errors, uncaught exceptions and every request;
// a request to any other origin is recorded and aborted.
async function openPage(origin, path = '/') {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 700 });
  const rec = { errors: [], foreign: [], requests: [], page };
  page.on('console', (msg) => { if (msg.type() === 'error') rec.errors.push(msg.text()); });
  page.on('pageerror', (err) => rec.errors.push('pageerror: ' + err.message));
  await page.setRequestInterception(true);
  page.on('request', (req) => {
    const url = new URL(req.url());
    rec.requests.push({ url: req.url(), method: req.method(), headers: req.headers() });
    if (url.origin !== origin) {
      rec.foreign.push(req.url());
      req.abort();
    } else if (rec.stub && rec.stub(req)) {
      // answered by the test
    } else {
      req.continue();
    }
  });
  rec.response = await page.goto(origin + path, { waitUntil: 'load' });
  return rec;
}

const text = (page, testid) => page.$eval(`[data-testid=${testid}]`, (el) => el.textContent);

async function metrics(origin) {
  const r = await fetch(origin + '/metrics');
  return r.text();
}
function gauge(body, name) {
  const m = body.match(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm'));
  return m ? Number(m[1]) : NaN;
}
// Polls the server until cond(metrics text) holds (a condition, not a sleep).
async function untilMetrics(origin, cond, timeoutMs = 10000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const body = await metrics(origin);
    if (cond(body)) return body;
    if (Date.now() > deadline) throw new Error('metrics condition not met:\n' + body.slice(0, 800));
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function setChat(page, { maxTokens, extra = '{"ignore_eos": true}', temperature = '0' }) {
  const set = async (testid, value) => {
    await page.$eval(`[data-testid=${testid}]`, (el, v) => { el.value = v; el.dispatchEvent(new Event('change')); }, value);
  };
  await set('chat-max-tokens', String(maxTokens));
  await set('chat-extra', extra);
  await set('chat-temperature', temperature);
}

describe('the web page on serve -tp 3', () => {
  let rec;
  before(async () => { rec = await openPage(open.origin); });

  test('loads with a CSP, shows the model and its context, no console errors', async () => {
    const { page, response } = rec;
    assert.equal(response.status(), 200);
    assert.match(response.headers()['content-type'], /^text\/html/);
    const csp = response.headers()['content-security-policy'];
    assert.match(csp, /default-src 'self'/);
    assert.match(csp, /script-src 'self'/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
    await page.waitForFunction(() => document.querySelector('[data-testid=model-name]').textContent === 'tiny-demo');
    assert.equal(await text(page, 'model-context'), 'context 32,768 tokens');
    assert.deepEqual(rec.errors, []);
  });

  test('a chat message streams: the reply grows before the request completes', async () => {
    const { page } = rec;
    await setChat(page, { maxTokens: 1500 });
    await page.type('[data-testid=chat-input]', 'Tell me a story about shards.');
    await page.click('[data-testid=chat-send]');
    await page.waitForSelector('[data-testid=chat-message-user]');
    // Two different non-empty lengths seen while the request is in flight:
    // the stop button is enabled until the page has read the stream to its end.
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll('[data-testid=chat-message-assistant]')].pop();
      const len = m ? m.querySelector('.content').textContent.length : 0;
      const inFlight = !document.querySelector('[data-testid=chat-stop]').disabled;
      window.__lengths = window.__lengths || [];
      if (inFlight && len > 0 && !window.__lengths.includes(len)) window.__lengths.push(len);
      return window.__lengths.length >= 2;
    }, { polling: 'raf', timeout: 20000 });
    await page.waitForSelector('[data-testid=chat-stop]:disabled', { timeout: 30000 });
    const status = await text(page, 'chat-status');
    assert.match(status, /^1500 tokens in /);
    const body = rec.requests.find((r) => r.url.endsWith('/v1/chat/completions'));
    assert.equal(body.method, 'POST');
    await page.screenshot({ path: join(artifacts, 'chat.png') });
    // History is kept in localStorage: a reload shows the conversation again.
    await page.reload({ waitUntil: 'load' });
    await page.waitForSelector('[data-testid=chat-message-assistant]');
    assert.equal((await page.$$('[data-testid=chat-message-user]')).length, 1);
    assert.deepEqual(rec.errors, []);
  });

  test('stop ends a long generation, and the server frees it', async () => {
    const { page } = rec;
    await page.click('[data-testid=chat-new]');
    await setChat(page, { maxTokens: 30000 });
    await page.type('[data-testid=chat-input]', 'Go on for as long as you can.');
    await page.click('[data-testid=chat-send]');
    await page.waitForFunction(() => {
      const m = [...document.querySelectorAll('[data-testid=chat-message-assistant]')].pop();
      return m && m.querySelector('.content').textContent.length > 0;
    });
    await untilMetrics(open.origin, (m) => gauge(m, 'vllm:num_requests_running') === 1);
    await page.click('[data-testid=chat-stop]');
    await page.waitForSelector('[data-testid=chat-stop]:disabled', { timeout: 5000 });
    assert.equal(await text(page, 'chat-status'), 'stopped');
    await untilMetrics(open.origin, (m) => gauge(m, 'vllm:num_requests_running') === 0);
    const body = await metrics(open.origin);
    assert.ok(gauge(body, 'vllm:generation_tokens_total') < 30000, 'the stopped request ran to its end');
    assert.deepEqual(rec.errors, []);
  });

  test('the deployment tab shows one rank-memory per rank, planned beside measured', async () => {
    const { page } = rec;
    const deployment = await (await fetch(open.origin + '/v1/deployment')).json();
    assert.equal(deployment.ranks.length, 3);
    await page.click('[data-testid=tab-deployment]');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid=rank-memory]').length === 3);
    const ranks = await page.$$eval('[data-testid=rank-memory]', (els) => els.map((el) => ({
      rank: Number(el.dataset.rank),
      weights: [...el.querySelectorAll('tr[data-part=weights] .exact')].map((e) => e.textContent),
      kv: [...el.querySelectorAll('tr[data-part=kv_cache] .exact')].map((e) => e.textContent),
      bars: el.querySelectorAll('.bar .seg').length,
      text: el.textContent,
    })));
    for (const r of ranks) {
      const d = deployment.ranks[r.rank];
      const exact = (n) => n.toLocaleString('en-US') + ' B';
      // Two figures, planned and measured, even when they are equal.
      assert.deepEqual(r.weights, [exact(d.planned.weights), exact(d.measured.weights)]);
      assert.deepEqual(r.kv, [exact(d.planned.kv_cache), exact(d.measured.kv_cache)]);
      assert.ok(r.bars >= 3, 'stacked bar of weights, KV and workspace');
      assert.match(r.text, new RegExp(`Q heads [0-9–]+ \\(${d.q_heads.count}\\)`));
      assert.match(r.text, new RegExp(`KV heads [0-9–]+ \\(${d.kv_heads.count}\\)`));
    }
    const summary = await page.$eval('#deployment-summary', (el) => el.textContent);
    assert.match(summary, /TP=3 PP=1 DP=1/);
    await page.screenshot({ path: join(artifacts, 'deployment.png') });
    assert.deepEqual(rec.errors, []);
  });

  test('the metrics tab follows the server', async () => {
    const { page } = rec;
    await page.click('[data-testid=tab-metrics]');
    const updates = async () => Number(await page.$eval('[data-testid=metrics-updated]', (el) => el.dataset.updates || 0));
    const n0 = await updates();
    await page.waitForFunction((n) => Number(document.querySelector('[data-testid=metrics-updated]').dataset.updates) >= n + 2,
                               { timeout: 6000 }, n0);
    // A long generation from outside the page: the running count shows it
    // (within 3 s), generation tokens/s rises, and both fall back after.
    const ctl = new AbortController();
    const res = await fetch(open.origin + '/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ctl.signal,
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: 30000, ignore_eos: true }),
    });
    const reader = res.body.getReader();
    await reader.read();
    await page.waitForFunction(() => document.querySelector('[data-testid=metric-running]').textContent === '1', { timeout: 3000 });
    await page.waitForFunction(() => parseFloat(document.querySelector('[data-testid=metric-tokens-per-second]').textContent) > 0,
                               { timeout: 4000 });
    const kv = await text(page, 'metric-kv-usage');
    assert.match(kv, /^\d+\.\d%$/);
    // /metrics' per-rank memory and KV blocks: a row per rank, the peak above zero.
    await page.waitForFunction(() => document.querySelectorAll('[data-testid=metric-rank]').length === 3);
    const rows = await page.$$eval('[data-testid=metric-rank] td:last-child', (tds) => tds.map((td) => td.textContent));
    for (const row of rows) assert.match(row, /^\d+ \([1-9]\d*\) \/ 4,096$/);
    await page.screenshot({ path: join(artifacts, 'metrics.png') });
    ctl.abort();
    await reader.cancel().catch(() => {});
    await page.waitForFunction(() => document.querySelector('[data-testid=metric-running]').textContent === '0', { timeout: 5000 });
    const latency = await page.$eval('[data-testid=metric-latency]', (el) => el.textContent);
    assert.match(latency, /TTFT/);
    assert.deepEqual(rec.errors, []);
  });

  test('model output is rendered as text: Markdown, reasoning collapsed, tool calls, no HTML', async () => {
    const { page } = rec;
    await page.click('[data-testid=tab-chat]');
    await page.click('[data-testid=chat-new]');
    const chunk = (delta, finish = null) =>
      'data: ' + JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: finish }] }) + '\n\n';
    const hostile = 'Hello **world** <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script>\n\n' +
                    '```js\nalert("<b>not bold</b>")\n```\n\n- [bad](javascript:window.__pwned=3)\n- `code`';
    rec.stub = (req) => {
      if (!req.url().endsWith('/v1/chat/completions')) return false;
      req.respond({
        status: 200, contentType: 'text/event-stream',
        body: chunk({ role: 'assistant', reasoning_content: 'thinking <b>hard</b>' }) + chunk({ content: hostile }) +
              chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":' } }] }) +
              chunk({ tool_calls: [{ index: 0, function: { arguments: '"Paris"}' } }] }, 'tool_calls') + 'data: [DONE]\n\n',
      });
      return true;
    };
    await page.type('[data-testid=chat-input]', 'weather?');
    await page.click('[data-testid=chat-send]');
    await page.waitForSelector('[data-testid=chat-tool-call]');
    await page.waitForSelector('[data-testid=chat-stop]:disabled');
    rec.stub = null;
    const view = await page.$eval('[data-testid=chat-message-assistant]', (el) => ({
      reasoningOpen: el.querySelector('[data-testid=chat-reasoning]').open,
      reasoning: el.querySelector('[data-testid=chat-reasoning]').textContent,
      nImg: el.querySelectorAll('img').length,
      nScript: el.querySelectorAll('script').length,
      nBold: el.querySelectorAll('.content b').length,
      strong: el.querySelector('.content strong').textContent,
      code: el.querySelector('.content pre code').textContent,
      anchors: [...el.querySelectorAll('a')].map((a) => a.getAttribute('href')),
      tool: el.querySelector('[data-testid=chat-tool-call]').textContent,
      pwned: window.__pwned,
    }));
    assert.equal(view.reasoningOpen, false, 'reasoning is collapsed');
    assert.match(view.reasoning, /thinking <b>hard<\/b>/);
    assert.equal(view.nImg, 0);
    assert.equal(view.nScript, 0);
    assert.equal(view.nBold, 0);
    assert.equal(view.strong, 'world');
    assert.equal(view.code, 'alert("<b>not bold</b>")');
    assert.deepEqual(view.anchors, []);
    assert.match(view.tool, /get_weather/);
    assert.match(view.tool, /"city": "Paris"/);
    assert.equal(view.pwned, undefined);
    assert.deepEqual(rec.errors, []);
  });

  test('every request went to the serving host and no other', async () => {
    assert.deepEqual(rec.foreign, []);
    assert.ok(rec.requests.length > 5);
    const paths = new Set(rec.requests.map((r) => new URL(r.url).pathname));
    for (const p of ['/', '/app.js', '/style.css', '/v1/models', '/v1/chat/completions', '/v1/deployment', '/metrics'])
      assert.ok(paths.has(p), `the page requested ${p}`);
    await rec.page.close();
  });
});

describe('the web page on serve --api-key', () => {
  test('the page loads without the key, asks for it, and sends it with every API call', async () => {
    const rec = await openPage(keyed.origin);
    const { page } = rec;
    assert.equal(rec.response.status(), 200);
    await page.waitForSelector('[data-testid=api-key-input]', { visible: true });
    const first = await page.evaluate(() => fetch('/v1/models').then((r) => r.status));
    assert.equal(first, 401);
    // A wrong key is refused and the page says so.
    await page.type('[data-testid=api-key-input]', 'wrong');
    await page.click('[data-testid=api-key-save]');
    await page.waitForFunction(() => /refused/.test(document.getElementById('key-message').textContent));
    await page.type('[data-testid=api-key-input]', KEY);
    await page.screenshot({ path: join(artifacts, 'api-key.png') });
    await page.click('[data-testid=api-key-save]');
    await page.waitForFunction(() => document.querySelector('[data-testid=model-name]').textContent === 'tiny-demo');
    await page.waitForSelector('[data-testid=api-key-input]', { hidden: true });
    assert.equal(await page.evaluate(() => sessionStorage.getItem('shardlm-api-key')), KEY);
    assert.equal(await page.evaluate(() => localStorage.getItem('shardlm-api-key')), null);
    await setChat(page, { maxTokens: 8, extra: '' });
    const n = rec.requests.length;
    await page.type('[data-testid=chat-input]', 'hello');
    await page.click('[data-testid=chat-send]');
    await page.waitForSelector('[data-testid=chat-stop]:disabled');
    await page.waitForFunction(() => /^8 tokens in /.test(document.querySelector('[data-testid=chat-status]').textContent));
    const api = rec.requests.slice(n).filter((r) => new URL(r.url).pathname.startsWith('/v1/'));
    assert.ok(api.length >= 1);
    for (const r of api) assert.equal(r.headers.authorization, 'Bearer ' + KEY, r.url);
    // The only console errors are the refused (401) loads before the key.
    for (const e of rec.errors) assert.match(e, /401/);
    assert.deepEqual(rec.foreign, []);
    await page.close();
  });
});
