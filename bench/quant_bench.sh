#!/bin/sh
# Decode tokens/s and share of the memory-bandwidth roofline per quantized
# format against shardlm's own BF16, in one run on one shape: Qwen2.5-7B's
# layer (hidden 3584, intermediate 18944, 28/4 heads), 2 layers, a 4096-id
# vocabulary so the unquantized lm_head stays a small share of the bytes. The
# quantized checkpoints are `shardlm quantize` of the BF16 one (AWQ and GPTQ
# group 128, FP8 blocks 128x128). Each row is bench/decode_bench (batch 1,
# BF16 KV cache, all cores; prompt 32, 32 decoded tokens by default).
#   bench/quant_bench.sh [BUILD_DIR] [decode_bench args, e.g. --decode 64]
# llama.cpp Q4_0/Q8_0 beside AWQ/GPTQ-int8 on the 0.5B shape: bench/llama_cpp_compare.sh.
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
cmake --build "$build" --target shardlm decode_bench >/dev/null
cli="$build/src/cli/shardlm"
base="$build/bench/quant_q7_bf16"
if [ ! -f "$base/config.json" ]; then
  "$cli" make-model --like qwen2.5-7b --layers 2 --vocab 4096 --dtype bf16 --seed 1 --out "$base" >/dev/null
fi
for f in awq gptq gptq-int8 fp8; do
  if [ ! -f "$build/bench/quant_q7_$f/config.json" ]; then
    "$cli" quantize "$base" --quantize "$f" --group-size 128 --out "$build/bench/quant_q7_$f" >/dev/null
  fi
done
[ $# -gt 0 ] || set -- --prompt 32 --decode 32
printf '%-10s %14s %12s %12s %14s %10s\n' format "MB/token" "decode tok/s" "vs bf16" "roofline tok/s" "share"
bf16_tps=""
for f in bf16 awq gptq gptq-int8 fp8; do
  out=$("$build/bench/decode_bench" "$build/bench/quant_q7_$f" "$@")
  mb=$(echo "$out" | awk '/weight bytes per decode token/ {print $6}')
  tps=$(echo "$out" | awk '/^decode:/ {print $(NF-1)}')
  roof=$(echo "$out" | awk '/^roofline \(read\)/ {print $3}')
  share=$(echo "$out" | awk '/^roofline \(read\)/ {print $NF}')
  [ -n "$bf16_tps" ] || bf16_tps=$tps
  ratio=$(awk -v a="$tps" -v b="$bf16_tps" 'BEGIN {printf "%.2fx", a / b}')
  printf '%-10s %14s %12s %12s %14s %10s\n' "$f" "$mb" "$tps" "$ratio" "$roof" "$share"
done
