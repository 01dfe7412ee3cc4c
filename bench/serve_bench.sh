#!/usr/bin/env bash
# Serve a small synthetic model with `shardlm serve` and load-test it with
# `shardlm bench` at a few concurrencies; prints vLLM-style result tables,
# a sweep summary, and leaves JSON results (+ a PNG plot) in the output dir.
#
#   bench/serve_bench.sh                       # defaults below
#   SHARDLM=build/src/cli/shardlm CONCURRENCY=1,4,16 NUM_PROMPTS=64 bench/serve_bench.sh
#
# Environment (all optional):
#   SHARDLM       shardlm binary               (default: build/src/cli/shardlm, else `shardlm` on PATH)
#   LIKE          make-model --like preset     (default: qwen2.5-0.5b)
#   LAYERS        make-model --layers          (default: 2)
#   MODEL_ARGS    more make-model arguments, e.g. '--vocab 2048 --hidden 128'
#   MODEL_DIR     serve this model directory instead of making one
#   PORT          server port                  (default: a free loopback port)
#   CONCURRENCY   comma list for the sweep     (default: 1,4)
#   NUM_PROMPTS   requests per point           (default: 32)
#   INPUT_LEN     prompt tokens (approx.)      (default: 128)
#   OUTPUT_LEN    output tokens                (default: 32)
#   ENDPOINT      chat | completions           (default: completions; a synthetic
#                                               model may have no chat template)
#   OUT           results directory            (default: ./serve_bench_results)
#   HEALTH_TIMEOUT seconds to wait for /health (default: 120)
#   SERVE_ARGS    extra arguments for `shardlm serve`
#   BENCH_ARGS    extra arguments for `shardlm bench`
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARDLM=${SHARDLM:-}
if [[ -z "$SHARDLM" ]]; then
  if [[ -x "$here/build/src/cli/shardlm" ]]; then SHARDLM="$here/build/src/cli/shardlm"
  elif command -v shardlm >/dev/null 2>&1; then SHARDLM=$(command -v shardlm)
  else echo "serve_bench: no shardlm binary; build it (cmake --build build --target shardlm) or set SHARDLM" >&2; exit 1
  fi
fi
LIKE=${LIKE:-qwen2.5-0.5b}
LAYERS=${LAYERS:-2}
CONCURRENCY=${CONCURRENCY:-1,4}
NUM_PROMPTS=${NUM_PROMPTS:-32}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-32}
ENDPOINT=${ENDPOINT:-completions}
OUT=${OUT:-$PWD/serve_bench_results}
HEALTH_TIMEOUT=${HEALTH_TIMEOUT:-120}

subcommands=$("$SHARDLM" --help 2>/dev/null | sed -n '/^Subcommands:/,$p')
for sub in make-model serve bench; do
  if ! grep -qE "^  $sub( |$)" <<<"$subcommands"; then
    echo "serve_bench: '$SHARDLM $sub' is not available in this build" >&2
    exit 1
  fi
done

free_port() {
  /usr/bin/python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}
PORT=${PORT:-$(free_port)}
BASE_URL="http://127.0.0.1:$PORT"

work=$(mktemp -d "${TMPDIR:-/tmp}/serve_bench.XXXXXX")
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$OUT"
model=${MODEL_DIR:-}
if [[ -z "$model" ]]; then
  model=$work/model
  echo "== making a synthetic $LIKE model with $LAYERS layers ${MODEL_ARGS:-}"
  # shellcheck disable=SC2086
  "$SHARDLM" make-model --like "$LIKE" --layers "$LAYERS" ${MODEL_ARGS:-} --out "$model" >/dev/null
fi

echo "== starting shardlm serve on $BASE_URL (log: $OUT/serve.log)"
# shellcheck disable=SC2086
"$SHARDLM" serve "$model" --port "$PORT" ${SERVE_ARGS:-} >"$OUT/serve.log" 2>&1 &
server_pid=$!

http_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl -sf -o /dev/null --max-time 2 "$1"
  else
    /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" 2>/dev/null
  fi
}

echo -n "== waiting for $BASE_URL/health "
deadline=$((SECONDS + HEALTH_TIMEOUT))
until http_ok "$BASE_URL/health"; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo; echo "serve_bench: shardlm serve exited before becoming healthy; last lines of its log:" >&2
    tail -n 30 "$OUT/serve.log" >&2
    exit 1
  fi
  if (( SECONDS >= deadline )); then
    echo; echo "serve_bench: no healthy answer from $BASE_URL/health within ${HEALTH_TIMEOUT}s" >&2
    tail -n 30 "$OUT/serve.log" >&2
    exit 1
  fi
  echo -n "."; sleep 0.5
done
echo " ok"

echo "== shardlm bench: concurrency $CONCURRENCY, $NUM_PROMPTS prompts each, ~$INPUT_LEN in / $OUTPUT_LEN out tokens"
# shellcheck disable=SC2086
"$SHARDLM" bench --base-url "$BASE_URL" --endpoint "$ENDPOINT" \
  --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" \
  --sweep-concurrency "$CONCURRENCY" --save-result "$OUT/sweep.json" --plot "$OUT/sweep.png" \
  ${BENCH_ARGS:-}

echo "== results: $OUT/sweep.json, plot: $OUT/sweep.png, server log: $OUT/serve.log"
