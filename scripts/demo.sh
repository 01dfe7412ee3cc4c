#!/usr/bin/env bash
# The main job: install, build, make a synthetic Qwen2.5-0.5B-shaped model, and generate from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DSHARDLM_TESTS=OFF
model=${DEMO_MODEL_DIR:-/tmp/shardlm-demo-qwen2.5-0.5b}
build/src/cli/shardlm make-model --like qwen2.5-0.5b --layers 2 --out "$model"
build/src/cli/shardlm verify "$model"
build/src/cli/shardlm plan qwen2.5-7b --gpus 6xA100-40GB
build/src/cli/shardlm generate "$model" --chat "Hello! Who are you?" --max-tokens 32 --temperature 0
