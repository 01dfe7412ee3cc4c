#!/bin/sh
# Prefill/decode tokens/s of a qwen2.5-0.5b-shaped (all 24 layers) BF16 synthetic model and
# the ratio of decode speed to the memory-bandwidth roofline on this machine.
#   bench/decode_bench.sh [BUILD_DIR] [extra decode_bench args, e.g. --prompt 256 --decode 64]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
cmake --build "$build" --target shardlm decode_bench >/dev/null
model="$build/bench/qwen25_05b_bf16"
if [ ! -f "$model/config.json" ]; then
  "$build/src/cli/shardlm" make-model --like qwen2.5-0.5b --layers 0 --dtype bf16 --seed 1 --out "$model"
fi
exec "$build/bench/decode_bench" "$model" "$@"
