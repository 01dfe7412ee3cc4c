#!/bin/sh
# Decode tokens/s and share of the memory-bandwidth roofline per quantized
# format against shardlm's own BF16, in one run on one shape: Qwen2.5-7B's
# layer (hidden 3584, intermediate 18944, 28/4 heads), 2 layers, a 4096-id
# vocabulary so the unquantized lm_head stays a small share of the bytes. The
# quantized checkpoints are `shardlm quantize` of the BF16 one (AWQ and GPTQ
# group 128, FP8 blocks 128x128). Each row is bench/decode_bench (batch 1,
# BF16 KV cache, all cores; prompt 32, 32 decoded tokens by default). AWQ and
# GPTQ run twice: with int8 activations (the default) and with
# SHARDLM_QUANT_ACTIVATIONS=f32 (the exact dequantize-to-f32 kernels).
# The rows are measured interleaved, ROUNDS times (default 2), and each keeps
# its best run: on a shared machine every row sees the same load. Batch 8 and
# per-Linear figures: build/bench/quant_matmul_bench.
#   [ROUNDS=N] bench/quant_bench.sh [BUILD_DIR] [decode_bench args, e.g. --decode 64]
# llama.cpp Q4_0/Q8_0 beside AWQ/GPTQ-int8 on the 0.5B shape: bench/llama_cpp_compare.sh.
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
rounds=${ROUNDS:-2}
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
rows="bf16 awq awq/f32 gptq gptq/f32 gptq-int8 gptq-int8/f32 fp8"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
r=0
while [ "$r" -lt "$rounds" ]; do
  for row in $rows; do
    f=${row%/f32}
    acts=int8
    [ "$row" = "$f" ] || acts=f32
    out=$(SHARDLM_QUANT_ACTIVATIONS=$acts "$build/bench/decode_bench" "$build/bench/quant_q7_$f" "$@")
    tps=$(echo "$out" | awk '/^decode:/ {print $(NF-1)}')
    key=$(echo "$row" | tr '/' '_')
    best=$(cat "$tmp/$key.tps" 2>/dev/null || echo 0)
    if awk -v a="$tps" -v b="$best" 'BEGIN {exit !(a > b)}'; then
      echo "$tps" > "$tmp/$key.tps"
      echo "$out" > "$tmp/$key.out"
    fi
  done
  r=$((r + 1))
done
printf '%-14s %10s %12s %9s %14s %8s\n' format "MB/token" "decode tok/s" "vs bf16" "roofline tok/s" "share"
bf16_tps=$(cat "$tmp/bf16.tps")
for row in $rows; do
  key=$(echo "$row" | tr '/' '_')
  out=$(cat "$tmp/$key.out")
  tps=$(cat "$tmp/$key.tps")
  mb=$(echo "$out" | awk '/weight bytes per decode token/ {print $6}')
  roof=$(echo "$out" | awk '/^roofline \(read\)/ {print $3}')
  share=$(echo "$out" | awk '/^roofline \(read\)/ {print $NF}')
  ratio=$(awk -v a="$tps" -v b="$bf16_tps" 'BEGIN {printf "%.2fx", a / b}')
  label=$row
  case $row in bf16|fp8) ;; */f32) label="${row%/f32} f32-x" ;; *) label="$row int8-x" ;; esac
  printf '%-14s %10s %12s %9s %14s %8s\n' "$label" "$mb" "$tps" "$ratio" "$roof" "$share"
done
echo "(best of $rounds interleaved rounds; load average $(cut -d' ' -f1-3 /proc/loadavg))"
