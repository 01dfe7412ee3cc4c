#!/usr/bin/env bash
# Smoke test of bench/serve_bench.sh: `shardlm bench` against a running
# `shardlm serve` (tiny synthetic model, two concurrencies, a few prompts);
# every request must complete and the throughputs must be positive.
#   env: SHARDLM_CLI, SHARDLM_SOURCE_DIR (ctest sets them)
set -euo pipefail
: "${SHARDLM_CLI:?set SHARDLM_CLI to the shardlm binary}" "${SHARDLM_SOURCE_DIR:?set SHARDLM_SOURCE_DIR}"
# Busy 2-core CI machines: libgomp's active wait stalls engine steps for seconds.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
out=$(mktemp -d "${TMPDIR:-/tmp}/serve_bench_smoke.XXXXXX")
trap 'rm -rf "$out"' EXIT
n_prompts=6
SHARDLM=$SHARDLM_CLI OUT=$out CONCURRENCY=1,3 NUM_PROMPTS=$n_prompts INPUT_LEN=24 OUTPUT_LEN=8 HEALTH_TIMEOUT=60 \
  MODEL_ARGS="--vocab 2048 --hidden 128 --intermediate 256 --heads 4 --kv-heads 2 --dtype f32" \
  SERVE_ARGS="--max-model-len 256 --kv-cache-memory 16777216" \
  BENCH_ARGS="--timeout 30 --range-ratio 0" \
  bash "$SHARDLM_SOURCE_DIR/bench/serve_bench.sh" || { echo "FAIL: serve_bench.sh exited $?" >&2; cat "$out/serve.log" >&2 || true; exit 1; }
/usr/bin/python3 - "$out/sweep.json" "$n_prompts" <<'PY'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
points = json.load(open(path))
assert isinstance(points, list) and len(points) == 2, f"{path}: expected 2 sweep points, got {points!r:.300}"
for p in points:
    conc = p.get("max_concurrency")
    for key in ("completed", "request_throughput", "output_throughput", "total_token_throughput"):
        assert key in p, f"concurrency {conc}: no '{key}' in the result"
    assert p["completed"] == n, f"concurrency {conc}: completed {p['completed']} of {n} (failed {p.get('failed')}, errors {p.get('errors')!r:.300})"
    assert p["request_throughput"] > 0 and p["output_throughput"] > 0, f"concurrency {conc}: zero throughput {p}"
    assert p["total_output_tokens"] == n * 8, f"concurrency {conc}: {p['total_output_tokens']} output tokens, expected {n * 8}"
print("serve_bench smoke: OK", [(p.get("max_concurrency"), p["completed"], round(p["output_throughput"], 1)) for p in points])
PY
