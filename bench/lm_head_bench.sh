#!/bin/sh
# Batch-1 decode tokens/s of GPTQ checkpoints with the lm_head in BF16 (the
# tied embedding, as Qwen2.5-0.5B ships it) and quantized (`shardlm quantize
# --lm-head`: "lm_head": true, written untied), side by side in one run, on
# the Qwen2.5-0.5B shape (all 24 layers, vocab 151,936: the BF16 lm_head is
# 272 MB of the bytes each decoded token reads). All four checkpoints are
# `shardlm quantize` (group 128) of one BF16 synthetic model. Each row is
# bench/decode_bench (BF16 KV cache, default int8 activations, prompt 32, 32
# decoded tokens by default), measured interleaved ROUNDS times (default 3)
# keeping each row's best run, so every row sees the same load on a shared
# machine. Threads: OMP_NUM_THREADS (default 2). Not a test: it never fails
# on timing.
#   [ROUNDS=N] [OMP_NUM_THREADS=T] bench/lm_head_bench.sh [BUILD_DIR] [decode_bench args]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
rounds=${ROUNDS:-3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
cmake --build "$build" --target shardlm decode_bench >/dev/null
cli="$build/src/cli/shardlm"
base="$build/bench/lm_head_q05_bf16"
if [ ! -f "$base/config.json" ]; then
  "$cli" make-model --like qwen2.5-0.5b --layers 0 --dtype bf16 --seed 1 --out "$base" >/dev/null
fi
for f in gptq gptq-int8; do
  [ -f "$build/bench/lm_head_q05_$f/config.json" ] ||
    "$cli" quantize "$base" --quantize "$f" --group-size 128 --out "$build/bench/lm_head_q05_$f" >/dev/null
  [ -f "$build/bench/lm_head_q05_$f-lm_head/config.json" ] ||
    "$cli" quantize "$base" --quantize "$f" --group-size 128 --lm-head --out "$build/bench/lm_head_q05_$f-lm_head" >/dev/null
done
[ $# -gt 0 ] || set -- --prompt 32 --decode 32
rows="gptq gptq-lm_head gptq-int8 gptq-int8-lm_head"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
r=0
while [ "$r" -lt "$rounds" ]; do
  for row in $rows; do
    out=$("$build/bench/decode_bench" "$build/bench/lm_head_q05_$row" --no-bandwidth "$@")
    tps=$(echo "$out" | awk '/^decode:/ {print $(NF-1)}')
    best=$(cat "$tmp/$row.tps" 2>/dev/null || echo 0)
    if awk -v a="$tps" -v b="$best" 'BEGIN {exit !(a > b)}'; then
      echo "$tps" > "$tmp/$row.tps"
      echo "$out" > "$tmp/$row.out"
    fi
  done
  r=$((r + 1))
done
echo "threads $OMP_NUM_THREADS, best of $rounds interleaved runs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf '%-20s %10s %12s %16s\n' checkpoint "MB/token" "decode tok/s" "vs bf16 lm_head"
for row in $rows; do
  base_row=${row%-lm_head}
  tps=$(cat "$tmp/$row.tps")
  mb=$(awk '/weight bytes per decode token/ {print $6}' "$tmp/$row.out")
  ratio=$(awk -v a="$tps" -v b="$(cat "$tmp/$base_row.tps")" 'BEGIN {printf "%.2fx", a / b}')
  printf '%-20s %10s %12s %16s\n' "$row" "$mb" "$tps" "$ratio"
done
