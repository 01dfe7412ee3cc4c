#!/bin/sh
# Decode tokens/s of two builds side by side on one model, interleaved so
# both see the same machine load, and the ratio B / A (a refactor's cost on
# the hot path: A = before, B = after). Never fails on timing.
#   bench/decode_ab.sh BUILD_A BUILD_B [ROUNDS] [decode_bench args, e.g. --prompt 32 --decode 32]
# The model: a qwen2.5-0.5b-shaped BF16 synthetic checkpoint made by BUILD_A.
set -eu
a=$1
b=$2
rounds=${3:-3}
[ $# -ge 3 ] && shift 3 || shift 2
model="$a/bench/qwen25_05b_bf16"
if [ ! -f "$model/config.json" ]; then
  "$a/src/cli/shardlm" make-model --like qwen2.5-0.5b --layers 0 --dtype bf16 --seed 1 --out "$model" >/dev/null
fi
tps() {
  build=$1
  shift
  "$build/bench/decode_bench" "$model" --no-bandwidth "$@" | sed -n 's/^decode: .* = \([0-9.]*\) tok\/s$/\1/p'
}
sum_a=0
sum_b=0
i=0
while [ "$i" -lt "$rounds" ]; do
  ta=$(tps "$a" "$@")
  tb=$(tps "$b" "$@")
  echo "round $i: A $ta tok/s, B $tb tok/s"
  sum_a=$(echo "$sum_a + $ta" | bc -l)
  sum_b=$(echo "$sum_b + $tb" | bc -l)
  i=$((i + 1))
done
echo "decode B / A = $(echo "scale=3; $sum_b / $sum_a" | bc -l) (mean of $rounds interleaved rounds)"
