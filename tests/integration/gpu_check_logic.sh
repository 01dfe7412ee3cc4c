#!/usr/bin/env bash
# scripts/gpu-check.sh's own logic, without a GPU (it must work the first
# time it meets one):
#   - --prepare gathers the binaries into a pack whose libraries resolve with
#     nothing but the pack on the library path;
#   - --run (GPU_CHECK_DRY_RUN=1) runs every step on the CPU, and every row
#     that needs no GPU binary passes;
#   - --run stops a step that never ends at the overall deadline (SIGUSR1), still prints
#     the table and saves its logs to $OUT, exits non-zero and leaves no
#     process behind;
#   - gpu_check_compare.py accepts logits within the tolerance and a near-tie,
#     and refuses a real difference.
#   env: SHARDLM_SOURCE_DIR, SHARDLM_BINARY_DIR (ctest sets them)
set -uo pipefail
: "${SHARDLM_SOURCE_DIR:?}" "${SHARDLM_BINARY_DIR:?}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_logic.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
script=$SHARDLM_SOURCE_DIR/scripts/gpu-check.sh
compare=$SHARDLM_SOURCE_DIR/scripts/gpu_check_compare.py

# --prepare from the binaries this build already has.
GPU_BUILD_DIR=$SHARDLM_BINARY_DIR GPU_CHECK_PREBUILT=1 GPU_CHECK_DRY_RUN=1 GPU_WORK_DIR=$tmp/work \
  bash "$script" --prepare "$tmp/pack" >"$tmp/prepare.out" 2>&1 || { cat "$tmp/prepare.out" >&2; fail "--prepare exited $?"; }
[[ -f $tmp/pack/bin/shardlm.gz ]] || fail "--prepare left no bin/shardlm.gz: $(ls -R "$tmp/pack")"
grep -q '0 failed' "$tmp/prepare.out" || fail "--prepare's table: $(tail -n 5 "$tmp/prepare.out")"

# --run with a step that hangs: the deadline ends it. The deadline is the
# watchdog's SIGUSR1; this test sends that signal itself once the hanging
# step runs (an event, not the clock: the preflight's time varies), with the
# watchdog's own deadline far away.
mkdir -p "$tmp/out"
GPU_CHECK_DRY_RUN=1 GPU_CHECK_DEADLINE=3000 GPU_CHECK_SIMULATE_HANG=1 GPU_WORK_DIR=$tmp/work OUT=$tmp/out \
  bash "$script" --run "$tmp/pack" >"$tmp/run.out" 2>&1 &
run_pid=$!
hanging=
for _ in $(seq 3000); do
  hanging=$(pgrep -f 'sleep 100000' || true)
  [[ -n $hanging ]] && break
  kill -0 "$run_pid" 2>/dev/null || break
  sleep 0.1
done
[[ -n $hanging ]] || { cat "$tmp/run.out" >&2; fail "the simulated hang never started"; }
kill -USR1 "$run_pid"
wait "$run_pid"
rc=$?
[[ $rc == 1 ]] || { cat "$tmp/run.out" >&2; fail "--run with a hanging step exited $rc, expected 1"; }
grep -q "^deadline .*FAIL .*during 'simulated hang'" "$tmp/run.out" || { cat "$tmp/run.out" >&2; fail "no deadline row naming the step"; }
grep -q '^preflight ldd shardlm .*PASS' "$tmp/run.out" || fail "the preflight found libraries missing: $(grep preflight "$tmp/run.out")"
grep -Eq '^[0-9]+ passed, [1-9][0-9]* failed$' "$tmp/run.out" || fail "no summary line"
[[ -s $tmp/out/gpu-check-table.txt ]] || fail "no table in \$OUT: $(ls "$tmp/out")"
grep -q 'simulated hang' "$tmp/out/gpu-check-table.txt" || fail "the saved table does not name the step"
left=$(pgrep -f 'sleep 100000' || true)
[[ -z $left ]] || fail "processes left behind by the deadline: $left"

# The whole sequence with --device cpu standing in (exit 3: nothing ran on a
# GPU): every row passes but those that need a GPU binary or a GPU's speed.
mkdir -p "$tmp/out-dry"
GPU_CHECK_DRY_RUN=1 GPU_CHECK_PPL_TOKENS=1024 GPU_WORK_DIR=$tmp/work OUT=$tmp/out-dry \
  bash "$script" --run "$tmp/pack" >"$tmp/dry.out" 2>&1
rc=$?
[[ $rc == 3 ]] || { cat "$tmp/dry.out" >&2; fail "the dry run exited $rc, expected 3"; }
unexpected=$(sed -n '/^check  /,$p' "$tmp/dry.out" | grep -E '^[^ ].* (FAIL|PASS) ' | grep ' FAIL ' |
  grep -Ev '^(1 kernels vs CPU reference|1 BackendTest on CUDA|1 CudaBackend vs CPU reference|HBM copy bandwidth|3 device-local communicator|target: )' || true)
[[ -z $unexpected ]] || { cat "$tmp/dry.out" >&2; fail "dry-run rows failed: $unexpected"; }
for row in '2 tokens qwen2.5-7b' '2 perplexity demo model' '3 tp 6 on one device' '4 prefill qwen2.5-7b' \
  '4 decode qwen2.5-7b batch 64' '5 serve+bench concurrency 16'; do
  grep -q "^$row .*PASS" "$tmp/dry.out" || { cat "$tmp/dry.out" >&2; fail "no passing row '$row'"; }
done
[[ -s $tmp/out-dry/gpu-check-serve.log ]] || fail "the dry run saved no serve log to \$OUT: $(ls "$tmp/out-dry")"

# The float comparisons (f32 little-endian logit files).
/usr/bin/python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
def write(name, xs):
    open(f"{d}/{name}", "wb").write(struct.pack(f"<{len(xs)}f", *xs))
write("cpu.f32", [10.0, 9.95, 1.0, -3.0])
write("close.f32", [10.1, 9.9, 1.05, -3.0])
write("far.f32", [10.0, 9.95, 5.0, -3.0])
PY
python3 "$compare" logits "$tmp/cpu.f32" "$tmp/close.f32" 0.02 >/dev/null || fail "logits within 2% refused"
! python3 "$compare" logits "$tmp/cpu.f32" "$tmp/far.f32" 0.02 >/dev/null || fail "logits 40% apart accepted"
python3 "$compare" tie "$tmp/cpu.f32" 0 1 0.02 >/dev/null || fail "a near-tie (10 vs 9.95) refused"
! python3 "$compare" tie "$tmp/cpu.f32" 0 2 0.02 >/dev/null || fail "10 vs 1 called a near-tie"
echo "gpu-check logic: OK"
