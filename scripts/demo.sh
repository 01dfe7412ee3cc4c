#!/usr/bin/env bash
# The main job: install, build, then serve the trained demo model
# (models/shardlm-demo, the default when no model is named) and ask it
# something over the OpenAI chat API with curl, printing the answer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# Every option the job depends on is stated: a build/ that test.sh configured keeps its cache.
bash scripts/build.sh -DSHARDLM_TESTS=OFF -DSHARDLM_CUDA=OFF -DSHARDLM_SANITIZE=OFF -DSHARDLM_TSAN=OFF -DSHARDLM_NATIVE=ON
[[ ${SHARDLM_CONFIGURE_ONLY:-0} == 1 ]] && exit 0  # see scripts/build.sh
cli=${BUILD_DIR:-build}/src/cli/shardlm
$cli verify models/shardlm-demo
$cli plan qwen2.5-7b --gpus 6xA100-40GB
$cli generate --prompt "Once upon a time" --max-tokens 32 --temperature 0

port=${DEMO_PORT:-8077}
log=$(mktemp)
$cli serve --port "$port" --kv-cache-memory 64MiB >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$log"; echo "demo: the server exited" >&2; exit 1; }
  sleep 0.5
done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { cat "$log"; echo "demo: the server did not start in 60 s" >&2; exit 1; }
question="What does John 3:16 say?"
echo "user: $question"
answer=$(curl -sS --fail-with-body "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"shardlm-demo\", \"messages\": [{\"role\": \"user\", \"content\": \"$question\"}], \"max_tokens\": 64, \"temperature\": 0}")
echo "$answer" | python3 -c 'import json, sys; print("assistant:", json.load(sys.stdin)["choices"][0]["message"]["content"])'
