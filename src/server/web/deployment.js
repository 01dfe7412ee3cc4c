// The deployment tab: GET /v1/deployment drawn as replicas › pipeline stages
// › ranks; per rank a stacked bar of plan's weights, KV cache, workspace and
// reserve against the rank's capacity, and a table of planned beside
// measured bytes (measured = what the rank's allocator obtained).
import { apiJson, formatBytes, h, withCommas } from './api.js';

const $ = (id) => document.getElementById(id);
const PARTS = [
  ['weights', 'Weights'],
  ['kv_cache', 'KV cache'],
  ['workspace', 'Workspace'],
  ['reserve', 'Reserve'],
];

export async function loadDeployment() {
  const box = $('deployment');
  try {
    const d = await apiJson('/v1/deployment');
    render(d);
  } catch (e) {
    box.replaceChildren(h('p', { class: 'error-text', text: 'Could not load /v1/deployment: ' + e.message }));
  }
}

export function initDeployment() {
  $('deployment-refresh').addEventListener('click', loadDeployment);
  $('deployment-legend').replaceChildren(
    ...PARTS.map(([k, label]) => h('span', { class: 'key' }, h('span', { class: 'swatch part-' + k }), label)),
    h('span', { class: 'key' }, h('span', { class: 'swatch part-free' }), 'Free'));
}

function range(r, what) {
  if (!r || !r.count) return null;
  const span = r.count === 1 ? `${r.begin}` : `${r.begin}–${r.end - 1}`;
  return `${what} ${span} (${r.count})`;
}

function layoutText(d) {
  const l = d.layout;
  return `TP=${l.tp} PP=${l.pp} DP=${l.dp}` + (d.moe ? ` EP=${l.ep}` : '');
}

function render(d) {
  const summary = [
    ['Model', d.model], ['Architecture', d.architecture], ['Weights', d.dtype], ['Layout', layoutText(d)],
    ['Layers', withCommas(d.n_layers)], ['Q heads', withCommas(d.n_heads)], ['KV heads', withCommas(d.n_kv_heads)],
    ['Head dim', withCommas(d.head_dim)],
  ];
  if (d.moe) summary.push(['Experts', `${withCommas(d.n_experts)} (top ${d.n_experts_per_token})`]);
  summary.push(['Max model len', withCommas(d.max_model_len) + ' tokens'],
               ['KV cache', withCommas(d.kv_tokens_per_replica) + ' tokens per replica'],
               ['Ranks', withCommas(d.ranks.length)]);
  $('deployment-summary').replaceChildren(...summary.map(([k, v]) =>
    h('div', { class: 'fact' }, h('span', { class: 'label', text: k }), h('span', { class: 'value', text: String(v) }))));

  const replicas = new Map();
  for (const r of d.ranks) {
    if (!replicas.has(r.replica)) replicas.set(r.replica, new Map());
    const stages = replicas.get(r.replica);
    if (!stages.has(r.pp_rank)) stages.set(r.pp_rank, []);
    stages.get(r.pp_rank).push(r);
  }
  const tolerance = d.measured_tolerance || 0;
  const views = [];
  for (const [replica, stages] of [...replicas].sort((a, b) => a[0] - b[0])) {
    const rv = h('div', { class: 'replica', testid: 'replica' }, h('h3', { text: `Replica ${replica}` }));
    for (const [pp, ranks] of [...stages].sort((a, b) => a[0] - b[0])) {
      const layers = ranks[0].layers;
      const sv = h('div', { class: 'stage', testid: 'stage' },
                   h('h4', { text: `Stage ${pp}` + (layers && layers.count ? ` · layers ${layers.begin}–${layers.end - 1}` : '') }));
      const row = h('div', { class: 'ranks' });
      for (const r of ranks.sort((a, b) => a.tp_rank - b.tp_rank)) row.append(rankView(r, tolerance));
      sv.append(row);
      rv.append(sv);
    }
    views.push(rv);
  }
  $('deployment').replaceChildren(...views);
}

function rankView(r, tolerance) {
  const cap = Math.max(1, r.capacity_bytes);
  const bar = h('div', { class: 'bar', role: 'img' });
  let used = 0;
  for (const [k, label] of PARTS) {
    const v = r.planned[k] || 0;
    used += v;
    if (v <= 0) continue;
    const seg = h('div', { class: 'seg part-' + k, title: `${label}: ${withCommas(v)} B planned` });
    seg.style.width = (100 * v / cap).toFixed(3) + '%';
    bar.append(seg);
  }
  bar.setAttribute('aria-label', `planned ${formatBytes(used)} of ${formatBytes(r.capacity_bytes)}`);

  const table = h('table', { class: 'bytes' },
    h('thead', {}, h('tr', {}, h('th', { text: '' }), h('th', { text: 'planned' }), h('th', { text: 'measured' }))));
  const body = h('tbody');
  let plannedTotal = 0, measuredTotal = 0, measuredAll = true;
  for (const [k, label] of PARTS) {
    const p = r.planned[k] || 0;
    const m = r.measured[k];
    plannedTotal += p;
    if (m === null || m === undefined) { if (k !== 'reserve') measuredAll = false; } else measuredTotal += m;
    body.append(h('tr', { 'data-part': k },
      h('th', {}, h('span', { class: 'swatch part-' + k }), label),
      bytesCell(p),
      k === 'reserve' ? h('td', { class: 'muted', text: 'not allocated' })
        : m === null || m === undefined ? h('td', { class: 'muted', text: 'not measured' }) : bytesCell(m, p, tolerance)));
  }
  body.append(h('tr', { class: 'total' }, h('th', { text: 'Total' }), bytesCell(plannedTotal),
                h('td', {}, (measuredAll ? '' : '≥ ') + formatBytes(measuredTotal),
                  h('div', { class: 'exact', text: withCommas(measuredTotal) + ' B' }))));
  body.append(h('tr', { class: 'capacity' }, h('th', { text: 'Capacity' }), bytesCell(r.capacity_bytes), h('td', {})));
  table.append(body);

  const facts = [range(r.q_heads, 'Q heads'), range(r.kv_heads, 'KV heads'), range(r.experts, 'experts'),
                 `${withCommas(r.n_kv_blocks)} KV blocks · ${withCommas(r.kv_bytes_per_token)} B/token`].filter(Boolean);
  return h('div', { class: 'rank', testid: 'rank-memory', 'data-rank': r.rank, 'data-replica': r.replica },
    h('div', { class: 'rank-head' }, h('strong', { text: `rank ${r.rank}` }),
      h('span', { class: 'muted', text: ` tp ${r.tp_rank} · pp ${r.pp_rank} · ${r.device}` })),
    bar,
    h('div', { class: 'bar-caption muted', text: `${formatBytes(used)} of ${formatBytes(r.capacity_bytes)} planned (${(100 * used / cap).toFixed(1)}%)` }),
    table,
    h('ul', { class: 'shards' }, ...facts.map((f) => h('li', { text: f }))));
}

// "1.234 MiB" over the exact count; measured cells say how far from plan.
function bytesCell(v, planned, tolerance) {
  const td = h('td', {}, formatBytes(v), h('div', { class: 'exact', text: withCommas(v) + ' B' }));
  if (planned !== undefined) {
    const diff = planned ? (v - planned) / planned : (v ? 1 : 0);
    const ok = Math.abs(diff) <= (tolerance || 0) + 1e-12;
    td.append(h('div', { class: ok ? 'agree' : 'disagree',
                         text: v === planned ? '= planned' : `${diff > 0 ? '+' : ''}${(100 * diff).toFixed(2)}% vs planned` }));
  }
  return td;
}
