#!/bin/sh
# Constrained-decoding cost as a share of the decode step, batch 1 and 16, on a
# qwen2.5-0.5b-shaped synthetic model (4 layers, full 151,936-token vocabulary)
# with the real Qwen3 tokenizer's vocabulary when the tokenizer tests fetched
# it (else the model's synthetic tokenizer, whose few hundred tokens make
# masks unrealistically cheap).
#   bench/grammar_bench.sh [BUILD_DIR] [extra grammar_bench args, e.g. --decode 64]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
cmake --build "$build" --target shardlm grammar_bench >/dev/null
model="$build/bench/qwen25_05b_4layers"
if [ ! -f "$model/config.json" ]; then
  "$build/src/cli/shardlm" make-model --like qwen2.5-0.5b --layers 4 --dtype bf16 --seed 1 --out "$model" >/dev/null
fi
tok="$build/.cache/tokenizers/qwen3"
[ -f "$tok/tokenizer.json" ] || tok="$model"
exec "$build/bench/grammar_bench" "$model" --tokenizer "$tok" "$@"
