#!/bin/sh
# What each quantized format costs on a trained demo model ($DEMO_MODEL, default
# models/shardlm-demo-draft: the 1.4 M model the README's figures were measured on):
# `shardlm quantize` (round to nearest, AWQ/GPTQ group 64, FP8 blocks 128x128) of
# its BF16 weights, then `shardlm perplexity` on its held-out text (heldout.txt:
# never trained on) for each, and the top-1 agreement: the share of scored
# positions whose greedy token equals the BF16 model's (--dump-top1). Also the
# BF16 weights with an FP8 (E4M3) KV cache.
#   bench/quant_accuracy.sh [BUILD_DIR] [--max-tokens N]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
cli="$build/src/cli/shardlm"
demo=${DEMO_MODEL:-models/shardlm-demo-draft}
work="$build/bench/quant_accuracy"
mkdir -p "$work"
for f in awq gptq gptq-int8 fp8; do
  "$cli" quantize "$demo" --quantize "$f" --group-size 64 --out "$work/$f" >/dev/null
done
run() {  # name model [flags]
  name=$1; model=$2; shift 2
  "$cli" perplexity "$model" "$demo/heldout.txt" --json --dump-top1 "$work/$name.top1" "$@"
}
run bf16 "$demo" "$@" > "$work/bf16.json"
for f in awq gptq gptq-int8 fp8; do run "$f" "$work/$f" "$@" > "$work/$f.json"; done
run kv-fp8 "$demo" --kv-cache-dtype fp8 "$@" > "$work/kv-fp8.json"
/usr/bin/python3 - "$work" <<'PY'
import json, sys
import numpy as np
w = sys.argv[1]
base = json.load(open(f"{w}/bf16.json"))
top = np.fromfile(f"{w}/bf16.top1", dtype="<i4")
print(f"demo model, {base['scored']} scored tokens of heldout.txt")
print(f"{'weights':<22} {'perplexity':>10} {'change':>8} {'top-1 agreement':>16}")
for name in ["bf16", "awq", "gptq", "gptq-int8", "fp8", "kv-fp8"]:
    j = json.load(open(f"{w}/{name}.json"))
    t = np.fromfile(f"{w}/{name}.top1", dtype="<i4")
    label = "bf16 + fp8 KV cache" if name == "kv-fp8" else name
    print(f"{label:<22} {j['perplexity']:>10.3f} {100 * (j['perplexity'] / base['perplexity'] - 1):>+7.2f}% "
          f"{100 * float((t == top).mean()):>15.2f}%")
PY
