#!/bin/sh
# Serving throughput of a PP pipeline with one batch at a time vs PP
# micro-batches in flight, on a qwen2.5-0.5b-shaped (8 layers) BF16 synthetic
# model with a 2,048-token vocabulary. (With the real 151,936 the lm_head
# matmul on the last stage outweighs 8 layers: the byte-balanced split gives
# both stages 4 layers, the last stage is ~3x slower and overlap buys ~2%;
# --pp-layer-partition moves layers to stage 0.) Measured here (2 cores,
# PP 2, 8 requests of 32 + 32 tokens): 148 vs 193 tok/s, ratio 1.30.
#   bench/pipeline_bench.sh [BUILD_DIR] [extra pipeline_bench args, e.g. --pp 2 --requests 8]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
cmake --build "$build" --target shardlm pipeline_bench >/dev/null
model="$build/bench/qwen25_05b_8l_v2k_bf16"
if [ ! -f "$model/config.json" ]; then
  "$build/src/cli/shardlm" make-model --like qwen2.5-0.5b --layers 8 --vocab 2048 --dtype bf16 --seed 1 --out "$model"
fi
exec "$build/bench/pipeline_bench" "$model" "$@"
