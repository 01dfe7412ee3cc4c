// The metrics tab: /metrics (Prometheus text, vLLM's names) polled every
// second; rates from counter deltas, TTFT/TPOT percentiles from histogram
// bucket deltas, charts of the last five minutes drawn as SVG by DOM calls.
import { apiFetch, formatBytes, h, withCommas } from './api.js';

const $ = (id) => document.getElementById(id);
const SVG = 'http://www.w3.org/2000/svg';
const PERIOD_MS = 1000;
const HISTORY = 300;      // samples kept: five minutes at one a second
const WINDOW_S = 60;      // percentiles over the last minute

const samples = [];       // [{t, m: parsed metrics}]
const series = { gen: [], prompt: [], running: [], waiting: [], kv: [], hit: [] };
let cards = null;
let nUpdates = 0;
let timer = null;

// Prometheus text -> Map(name -> [{labels, value}]).
export function parsePrometheus(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = line.match(/^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(/([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    const value = Number(m[4]);
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

// Sum over every series of a name (replicas add up); NaN when absent.
function total(m, name) {
  const s = m.get(name);
  return s ? s.reduce((a, x) => a + x.value, 0) : NaN;
}
function mean(m, name) {
  const s = m.get(name);
  return s && s.length ? s.reduce((a, x) => a + x.value, 0) / s.length : NaN;
}

// Cumulative buckets [{le, count}] summed over replicas.
function buckets(m, name) {
  const byLe = new Map();
  for (const s of m.get(name + '_bucket') || []) {
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    byLe.set(le, (byLe.get(le) || 0) + s.value);
  }
  return [...byLe].map(([le, count]) => ({ le, count })).sort((a, b) => a.le - b.le);
}

function quantile(bs, q) {
  if (!bs.length) return NaN;
  const n = bs[bs.length - 1].count;
  if (n <= 0) return NaN;
  const target = q * n;
  let prevLe = 0, prevCount = 0;
  for (const b of bs) {
    if (b.count >= target) {
      if (b.le === Infinity) return prevLe;  // above the last bound: report it
      const width = b.count - prevCount;
      return width > 0 ? prevLe + (b.le - prevLe) * (target - prevCount) / width : b.le;
    }
    prevLe = b.le; prevCount = b.count;
  }
  return prevLe;
}

function delta(now, then) {
  if (!then) return now;
  const old = new Map(then.map((b) => [b.le, b.count]));
  return now.map((b) => ({ le: b.le, count: b.count - (old.get(b.le) || 0) }));
}

function card(id, title, testid) {
  const value = h('div', { class: 'value', testid, text: '—' });
  const sub = h('div', { class: 'sub muted' });
  const chart = document.createElementNS(SVG, 'svg');
  chart.setAttribute('viewBox', '0 0 300 60');
  chart.setAttribute('preserveAspectRatio', 'none');
  chart.classList.add('chart');
  const el = h('div', { class: 'card', id }, h('div', { class: 'title', text: title }), value, sub, chart);
  $('metric-cards').append(el);
  return { value, sub, chart };
}

function draw(svg, lines, fixedMax) {
  const max = fixedMax || Math.max(1e-9, ...lines.flatMap((l) => l.data));
  svg.replaceChildren();
  for (const frac of [0.5]) {
    const grid = document.createElementNS(SVG, 'line');
    grid.setAttribute('x1', '0'); grid.setAttribute('x2', '300');
    grid.setAttribute('y1', String(60 * frac)); grid.setAttribute('y2', String(60 * frac));
    grid.classList.add('grid');
    svg.append(grid);
  }
  // The x axis spans the samples so far (at least a minute), up to five minutes.
  const span = Math.max(60, ...lines.map((l) => l.data.length)) - 1;
  for (const l of lines) {
    if (!l.data.length) continue;
    const pts = l.data.map((v, i) => {
      const x = 300 - (l.data.length - 1 - i) * (300 / span);
      const y = 58 - 56 * (Number.isFinite(v) ? v : 0) / max;
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', pts.join(' '));
    line.classList.add('series', l.cls);
    svg.append(line);
  }
  const label = document.createElementNS(SVG, 'text');
  label.setAttribute('x', '2'); label.setAttribute('y', '10');
  label.classList.add('axis');
  label.textContent = fixedMax === 1 ? '100%' : fmt(max);
  svg.append(label);
  const window_ = document.createElementNS(SVG, 'text');
  window_.setAttribute('x', '298'); window_.setAttribute('y', '10'); window_.setAttribute('text-anchor', 'end');
  window_.classList.add('axis');
  window_.textContent = `last ${Math.round((span + 1) * PERIOD_MS / 1000)} s`;
  svg.append(window_);
}

function fmt(v, digits = 1) {
  if (!Number.isFinite(v)) return '—';
  if (Math.abs(v) >= 1000) return withCommas(v);
  return v.toFixed(digits);
}
function ms(v) {
  if (!Number.isFinite(v)) return '—';
  return v >= 1 ? v.toFixed(2) + ' s' : (v * 1000).toFixed(v < 0.01 ? 2 : 1) + ' ms';
}
function push(arr, v) { arr.push(v); if (arr.length > HISTORY) arr.shift(); }

export function initMetrics() {
  cards = {
    tps: card('card-tps', 'Tokens/s (generation · prompt)', 'metric-tokens-per-second'),
    running: card('card-running', 'Requests running (· waiting)', 'metric-running'),
    kv: card('card-kv', 'KV cache usage', 'metric-kv-usage'),
    hit: card('card-hit', 'Prefix-cache hit rate', 'metric-prefix-hit-rate'),
  };
  poll();
  timer = setInterval(poll, PERIOD_MS);
}

let inFlight = false;
async function poll() {
  if (inFlight) return;
  inFlight = true;
  try {
    const res = await apiFetch('/metrics');
    update(parsePrometheus(await res.text()));
  } catch (e) {
    $('metrics-updated').textContent = 'metrics unavailable: ' + e.message;
  } finally {
    inFlight = false;
  }
}

function update(m) {
  const t = performance.now() / 1000;
  const prev = samples[samples.length - 1];
  samples.push({ t, m });
  if (samples.length > HISTORY) samples.shift();
  const dt = prev ? t - prev.t : 0;
  const rate = (name) => (prev && dt > 0 ? Math.max(0, (total(m, name) - total(prev.m, name)) / dt) : 0);
  const gen = rate('vllm:generation_tokens_total');
  const prompt = rate('vllm:prompt_tokens_total');
  const running = total(m, 'vllm:num_requests_running');
  const waiting = total(m, 'vllm:num_requests_waiting');
  const kv = mean(m, 'vllm:kv_cache_usage_perc');
  const queries = total(m, 'vllm:prefix_cache_queries_total');
  const hits = total(m, 'vllm:prefix_cache_hits_total');
  const hitRate = queries > 0 ? hits / queries : NaN;
  push(series.gen, gen); push(series.prompt, prompt); push(series.running, running);
  push(series.waiting, waiting); push(series.kv, kv); push(series.hit, hitRate);

  cards.tps.value.textContent = `${fmt(gen)} · ${fmt(prompt)}`;
  cards.tps.sub.textContent = `${withCommas(total(m, 'vllm:generation_tokens_total') || 0)} generated, ${withCommas(total(m, 'vllm:prompt_tokens_total') || 0)} prompt tokens since start`;
  draw(cards.tps.chart, [{ data: series.gen, cls: 's1' }, { data: series.prompt, cls: 's2' }]);
  cards.running.value.textContent = Number.isFinite(running) ? String(running) : '—';
  cards.running.sub.textContent = Number.isFinite(waiting) ? `${waiting} waiting` : '';
  draw(cards.running.chart, [{ data: series.running, cls: 's1' }, { data: series.waiting, cls: 's2' }]);
  cards.kv.value.textContent = Number.isFinite(kv) ? (100 * kv).toFixed(1) + '%' : '—';
  draw(cards.kv.chart, [{ data: series.kv, cls: 's1' }], 1);
  cards.hit.value.textContent = Number.isFinite(hitRate) ? (100 * hitRate).toFixed(1) + '%' : '—';
  cards.hit.sub.textContent = `${withCommas(hits || 0)} of ${withCommas(queries || 0)} prompt tokens from the cache`;
  draw(cards.hit.chart, [{ data: series.hit, cls: 's1' }], 1);

  latency(m);
  ranks(m);
  ++nUpdates;
  const stamp = $('metrics-updated');
  stamp.textContent = `updated ${new Date().toLocaleTimeString()} (every ${PERIOD_MS / 1000} s)`;
  if (!m.has('vllm:num_requests_running') && m.has('shardlm_router_requests_total'))
    stamp.textContent += ' · this is shardlm router: engine metrics are on each backend\'s /metrics';
  stamp.dataset.updates = String(nUpdates);
}

function latency(m) {
  const old = samples.find((s) => samples[samples.length - 1].t - s.t <= WINDOW_S);
  const rows = [['TTFT', 'vllm:time_to_first_token_seconds'], ['TPOT (inter-token)', 'vllm:inter_token_latency_seconds'],
                ['End to end', 'vllm:e2e_request_latency_seconds']];
  const head = h('tr', {}, h('th', { text: '' }), h('th', { text: 'p50' }), h('th', { text: 'p90' }), h('th', { text: 'p99' }),
                 h('th', { text: 'requests' }), h('th', { text: 'over' }));
  const body = rows.map(([label, name]) => {
    const nowB = buckets(m, name);
    let b = old && old !== samples[samples.length - 1] ? delta(nowB, buckets(old.m, name)) : nowB;
    let over = `last ${WINDOW_S} s`;
    if (!b.length || b[b.length - 1].count <= 0) { b = nowB; over = 'since start'; }
    const n = b.length ? b[b.length - 1].count : 0;
    return h('tr', {}, h('th', { text: label }), h('td', { text: ms(quantile(b, 0.5)) }), h('td', { text: ms(quantile(b, 0.9)) }),
             h('td', { text: ms(quantile(b, 0.99)) }), h('td', { text: withCommas(n) }), h('td', { class: 'muted', text: over }));
  });
  $('latency').replaceChildren(h('thead', {}, head), h('tbody', {}, ...body));
}

// Per-rank memory and KV blocks, when /metrics carries them.
function ranks(m) {
  const mem = m.get('shardlm:rank_memory_bytes') || [];
  const used = m.get('shardlm:kv_blocks_in_use') || [];
  const peak = m.get('shardlm:kv_blocks_in_use_peak') || [];
  const total_ = m.get('shardlm:kv_blocks') || [];
  if (!mem.length && !used.length) return;
  const key = (l) => `${l.replica || 0}/${l.rank || 0}`;
  const rows = new Map();
  const row = (l) => {
    const k = key(l);
    if (!rows.has(k)) rows.set(k, { replica: l.replica || '0', rank: l.rank || '0', v: {} });
    return rows.get(k);
  };
  for (const s of mem) row(s.labels).v[`${s.labels.kind}/${s.labels.source}`] = s.value;
  for (const s of used) row(s.labels).v.used = s.value;
  for (const s of peak) row(s.labels).v.peak = s.value;
  for (const s of total_) row(s.labels).v.blocks = s.value;
  const kinds = ['weights', 'kv_cache', 'workspace'];
  const head = h('tr', {}, h('th', { text: 'replica/rank' }),
                 ...kinds.map((k) => h('th', { text: `${k} planned / measured` })),
                 h('th', { text: 'KV blocks in use (peak) / total' }));
  const body = [...rows.values()].map((r) => h('tr', { testid: 'metric-rank' }, h('th', { text: `${r.replica}/${r.rank}` }),
    ...kinds.map((k) => h('td', { text: `${formatBytes(r.v[k + '/planned'])} / ${r.v[k + '/measured'] === undefined ? 'not measured' : formatBytes(r.v[k + '/measured'])}` })),
    h('td', { text: `${fmt(r.v.used, 0)} (${fmt(r.v.peak, 0)}) / ${fmt(r.v.blocks, 0)}` })));
  $('rank-metrics').replaceChildren(h('thead', {}, head), h('tbody', {}, ...body));
  $('rank-metrics').hidden = false;
  $('rank-metrics-title').hidden = false;
}
