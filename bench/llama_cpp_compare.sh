#!/usr/bin/env bash
# shardlm beside llama.cpp on the same CPU, the same synthetic checkpoint and the same thread
# count (issues 10 and 14). Not part of CI; it never fails on timing. It prints one table,
# metric | llama.cpp | shardlm | ratio | target | met?, every figure a median of interleaved
# runs (llama.cpp, shardlm, llama.cpp, shardlm, ...) made in this one invocation, and the
# rooflines (memory bandwidth, f32 FMA peak) measured in the same rounds. Then the kernel paths
# (issue 28): the CPU model and features, the kernel each shardlm configuration's matmuls took
# (SHARDLM_KERNEL_REPORT: counted at dispatch, by shape) and llama.cpp's (its system_info line,
# and per GGUF which tensors its CPU_REPACK/AMX buffers took), by bench/llama_cpp_paths.py.
#
#   bench/llama_cpp_compare.sh            # Qwen2.5-0.5B and 1.5B shapes, 3 rounds (~30 min quiet)
#   bench/llama_cpp_compare.sh --quick    # 0.5B only, 1 round, no serve row, for iterating (~5 min quiet)
#   options: --build-dir DIR (default build), --threads N (default 2), --rounds N, --serve / --no-serve,
#     --llama-dir DIR: a llama.cpp folder this script built before (DIR/src, DIR/build/bin/llama-bench, ...;
#       default BUILD/llama.cpp), used as it is: nothing is built or written there
#
# What it does:
#  1. llama.cpp: `npm pack node-llama-cpp@3.21.1` into BUILD/.cache/npm, clones the llama.cpp
#     source the package bundles (commit 80fb11a) into BUILD/llama.cpp/src, and builds it CPU-only
#     (GGML_NATIVE, Release, static, no CUDA/Vulkan/Metal) into BUILD/llama.cpp/build: llama-bench,
#     llama-batched-bench, llama-quantize (with --llama-dir, that folder's instead: nothing is built);
#     bench/llama_greedy.cpp is compiled against it into BUILD/llama_cpp_compare. Nothing is written
#     into the repository. The first build takes a long while on 2 cores.
#  2. Checkpoints: `shardlm make-model --like qwen2.5-0.5b|1.5b --layers 0 --dtype bf16 --seed 1`,
#     written as GGUF bit for bit by bench/llama_cpp_gguf.py (llama.cpp's gguf-py), then Q4_0 and
#     Q8_0 by llama-quantize (its defaults: the tied embedding/output matrix becomes Q6_K / Q8_0);
#     `shardlm quantize --quantize awq|gptq-int8` of the same BF16 checkpoint (group 128).
#  3. Token agreement first: `shardlm generate --prompt-ids` against llama_greedy (F32 KV cache on
#     both sides), 32 greedy tokens; at the first divergence, both engines' logit gaps between
#     the two candidates (random weights have near-ties).
#     llama-bench -v's load log of each GGUF (its buffer types and repacked tensors) is kept for
#     the kernel paths.
#  4. Rounds; in each, in this order (A = llama.cpp, B = shardlm, both with --threads threads):
#     machine_peak (read/triad bandwidth, f32 FMA peak: bench/bandwidth.h, bench/machine_peak.cpp);
#     decode batch 1: A llama-bench tg64 (64 tokens from an empty cache), B `shardlm generate
#       --decode-bench 1 --decode-context 1 --decode-steps 64` (64 timed steps after 3 untimed);
#     pp512: A llama-bench pp512 (one 512-token batch, logits of the last), B bench/decode_bench
#       --prompt 512 (shardlm generate's path: one 512-token prefill, logits of the last);
#     4 and 16 streams (0.5B): A llama-batched-bench -npp 128 -ntg 32 -npl 4,16 -pps, its S_TG
#       (decode steps of B sequences that each hold 128 tokens); B `--decode-bench 4,16
#       --decode-context 128 --decode-steps 32`, the same decode steps in process;
#     TP=2 as threads (0.5B, shardlm only): `--decode-bench 1 --tp 2` against TP=1's figure;
#     quantized, batch 1 (0.5B): A llama-bench tg64 on Q4_0 and Q8_0, B decode-bench 1 on the AWQ
#       and GPTQ-int8 checkpoints (lm_head in BF16), and on GPTQ-int8 with the lm_head quantized too
#       (`quantize --lm-head`: "lm_head": true, the layout that matches Q8_0's Q8_0 output matrix);
#     16 streams through `shardlm serve` (0.5B; default on, off with --quick): `shardlm bench` at concurrency
#       16, 16 requests of distinct random token-id prompts (128 ids, so the prefix cache has
#       nothing to reuse) and 64 output tokens each: its output tokens/s, which includes the
#       prefill and HTTP that llama-batched-bench's S_TG leaves out, and 16 ÷ its median
#       time per output token (the decode rate while the 16 stream, first tokens excluded), and
#       16 ÷ its median inter-token latency (the same without the prefill steps of requests that
#       reached the engine after its first step, which a TPOT holds);
#       A llama-batched-bench -npp 128 -ntg 64 -npl 16 (16 distinct 128-token prompts, 64 tokens
#       each), 16 × 64 ÷ its total time: llama.cpp's output tokens/s of the same workload, prefill
#       included, which the serve output row is compared with (the TPOT row stays against S_TG);
#     In round 1 every shardlm run writes its kernel report (SHARDLM_KERNEL_REPORT) into
#     llama_cpp_compare/kernels/ (counting costs one map update per matmul, microseconds a step).
#     Roofline share = tokens/s ÷ (read bandwidth ÷ weight bytes per token), llama.cpp's bytes
#     being the GGUF's tensor bytes (llama_model_size) and shardlm's its allocator's weight bytes
#     (tied embeddings: the whole matrix is read as the lm_head). FMA share of pp512 = tokens/s ×
#     flops per prompt token (2 × every decoder matrix + causal attention at 512) ÷ FMA peak.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build
threads=2
rounds=""
quick=0
serve=""
llama_dir=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1 ;;
    --no-serve) serve=0 ;;
    --serve) serve=1 ;;
    --build-dir) build=$(cd "$2" && pwd); shift ;;
    --llama-dir) llama_dir=$(cd "$2" && pwd) || { echo "llama_cpp_compare: --llama-dir $2: no such folder" >&2; exit 2; }; shift ;;
    --threads) threads=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "llama_cpp_compare: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "llama_cpp_compare: --threads $threads: expected a positive integer" >&2; exit 2; }
if [[ -z "$rounds" ]]; then rounds=$((quick ? 1 : 3)); fi
if [[ -z "$serve" ]]; then serve=$((quick ? 0 : 1)); fi
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "llama_cpp_compare: --rounds $rounds: expected a positive integer" >&2; exit 2; }
models="0.5b"
[[ $quick == 1 ]] || models="0.5b 1.5b"

log() { echo "== $*" >&2; }
die() { echo "llama_cpp_compare: $*" >&2; exit 1; }
# Every step is bounded: timeout SECONDS command...; all work runs at nice 5 (a shared machine).
run() { local t=$1; shift; timeout "$t" nice -n 5 "$@"; }

cli=$build/src/cli/shardlm
lcp=${llama_dir:-$build/llama.cpp}
work=$build/llama_cpp_compare
mkdir -p "$work" "$work/kernels"
rm -f "$work"/kernels/*.txt "$work"/llama_load.*.err
lscpu >"$work/lscpu.txt" 2>/dev/null || true
results=$work/results.tsv
: >"$results"
put() { printf '%s\t%s\n' "$1" "$2" >>"$results"; }

# --- shardlm -----------------------------------------------------------------
log "building shardlm, decode_bench, machine_peak in $build"
[[ -f "$build/CMakeCache.txt" ]] || die "$build is not a configured build folder; run scripts/build.sh first"
run 3000 cmake --build "$build" --target shardlm decode_bench machine_peak >"$work/shardlm_build.log" 2>&1 ||
  { tail -20 "$work/shardlm_build.log" >&2; die "building shardlm failed (log: $work/shardlm_build.log)"; }

# --- llama.cpp ---------------------------------------------------------------
pkg=node-llama-cpp@3.21.1
tgz=$build/.cache/npm/node-llama-cpp-3.21.1.tgz
src=$lcp/src
lbin=$lcp/build/bin
ltools=(llama-bench llama-batched-bench llama-quantize)
if [[ -n "$llama_dir" ]]; then
  # Someone else's build: read it, never build or write into it (gguf-py included).
  for t in "${ltools[@]}"; do
    [[ -x "$lbin/$t" ]] || die "--llama-dir $llama_dir has no build/bin/$t; run the script once without --llama-dir"
  done
  [[ -f "$src/CMakeLists.txt" && -f "$lcp/build/src/libllama.a" ]] ||
    die "--llama-dir $llama_dir lacks src/ or build/src/libllama.a"
  export PYTHONDONTWRITEBYTECODE=1
fi
if [[ ! -f "$src/CMakeLists.txt" ]]; then
  if [[ ! -f "$tgz" ]]; then
    log "npm pack $pkg into $build/.cache/npm"
    mkdir -p "$build/.cache/npm"
    (cd "$build/.cache/npm" && run 600 npm pack "$pkg" >/dev/null) || die "npm pack $pkg failed"
  fi
  log "unpacking llama.cpp's source from $pkg"
  ext=$build/.cache/node-llama-cpp-3.21.1
  mkdir -p "$ext"
  tar xzf "$tgz" -C "$ext"
  bundle=$ext/package/llama/gitRelease.bundle
  [[ -f "$bundle" ]] || die "$tgz has no llama/gitRelease.bundle; is it node-llama-cpp 3.21.1?"
  mkdir -p "$lcp"
  git clone -q "$bundle" "$src" 2>/dev/null || die "cloning $bundle failed"
fi
commit=$(git -C "$src" rev-parse HEAD)
[[ $commit == 80fb11a* ]] || log "warning: llama.cpp source is at $commit, not 80fb11a"
need_build=0
for t in "${ltools[@]}"; do [[ -x "$lbin/$t" ]] || need_build=1; done
if [[ -n "$llama_dir" ]] && [[ $need_build == 1 || ! -f "$lcp/build/src/libllama.a" ]]; then
  die "--llama-dir $lcp: its build lacks one of ${ltools[*]} or build/src/libllama.a (it is used read-only)"
fi
if [[ $need_build == 1 || ! -f "$lcp/build/src/libllama.a" ]]; then
  log "building llama.cpp ${commit:0:7} CPU-only (log: $lcp/build.log); the first build is long on 2 cores"
  if [[ ! -f "$lcp/build/CMakeCache.txt" ]]; then
    run 600 cmake -S "$src" -B "$lcp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
      -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
      $(command -v ccache >/dev/null && echo -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache) \
      >"$lcp/configure.log" 2>&1 || { tail -20 "$lcp/configure.log" >&2; die "configuring llama.cpp failed"; }
  fi
  run 5400 cmake --build "$lcp/build" -j"$(nproc)" --target "${ltools[@]}" llama >"$lcp/build.log" 2>&1 ||
    { tail -20 "$lcp/build.log" >&2; die "building llama.cpp failed (log: $lcp/build.log)"; }
fi
greedy=$work/llama_greedy  # in this build folder: --llama-dir is only read
if [[ ! -x "$greedy" || "$root/bench/llama_greedy.cpp" -nt "$greedy" || "$lcp/build/src/libllama.a" -nt "$greedy" ]]; then
  log "compiling bench/llama_greedy.cpp against llama.cpp"
  run 600 g++ -O2 -std=c++17 -march=native -I"$src/include" -I"$src/ggml/include" "$root/bench/llama_greedy.cpp" \
    "$lcp/build/src/libllama.a" "$lcp/build/ggml/src/libggml.a" "$lcp/build/ggml/src/libggml-cpu.a" \
    "$lcp/build/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -o "$greedy" || die "compiling llama_greedy failed"
fi

# --- checkpoints ---------------------------------------------------------------
make_models() {  # $1 = 0.5b | 1.5b
  local m=$1 d=$work/qwen2.5-$1
  if [[ ! -f "$d/bf16/config.json" ]]; then
    log "make-model --like qwen2.5-$m (all layers, bf16, seed 1)"
    run 1200 "$cli" make-model --like "qwen2.5-$m" --layers 0 --dtype bf16 --seed 1 --out "$d/bf16" >/dev/null
  fi
  if [[ ! -f "$d/bf16.gguf" || "$d/bf16/model.safetensors" -nt "$d/bf16.gguf" ]]; then
    log "writing $d/bf16.gguf with llama.cpp's gguf-py"
    run 1800 /usr/bin/python3 "$root/bench/llama_cpp_gguf.py" "$d/bf16" "$d/bf16.gguf.tmp" --gguf-py "$src/gguf-py" >&2
    mv "$d/bf16.gguf.tmp" "$d/bf16.gguf"
  fi
  [[ $m == 0.5b ]] || return 0
  local q
  for q in Q4_0 Q8_0; do
    if [[ ! -f "$d/$q.gguf" || "$d/bf16.gguf" -nt "$d/$q.gguf" ]]; then
      log "llama-quantize $q"
      run 1800 "$lbin/llama-quantize" "$d/bf16.gguf" "$d/$q.gguf" "$q" "$threads" >"$d/$q.log" 2>&1 ||
        { tail -5 "$d/$q.log" >&2; die "llama-quantize $q failed"; }
    fi
  done
  for q in awq gptq-int8; do
    if [[ ! -f "$d/$q/config.json" ]]; then
      log "shardlm quantize --quantize $q"
      run 1800 "$cli" quantize "$d/bf16" --quantize "$q" --group-size 128 --out "$d/$q" >/dev/null
    fi
  done
  # The layout that matches llama.cpp's Q8_0, whose output matrix is Q8_0 too: GPTQ-int8 with
  # "lm_head": true (GPTQModel's quantize_config), the tied embedding written untied.
  if [[ ! -f "$d/gptq-int8-lmhead/config.json" ]]; then
    log "shardlm quantize --quantize gptq-int8 --lm-head"
    run 1800 "$cli" quantize "$d/bf16" --quantize gptq-int8 --group-size 128 --lm-head --out "$d/gptq-int8-lmhead" >/dev/null
  fi
}
for m in $models; do make_models "$m"; done

export OMP_NUM_THREADS=$threads  # caps shardlm's ranks (backend::set_num_threads) and llama.cpp's OpenMP
# The shardlm CLI's libgomp workers spin 10,000 iterations, then sleep, unless told otherwise
# (src/cli/main.cpp); decode_bench and llama.cpp (OpenMP too) get the same, so all of them wait
# for work the same way. An OMP_WAIT_POLICY in the environment overrides it for all.
[[ -n ${OMP_WAIT_POLICY:-} ]] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}

# --- token agreement -------------------------------------------------------------
prompt=1,17,300,42,5,99,260,7
n_agree=32
agreement() {  # $1 = model size; puts agree.$1 = "32/32" or "k/32, ..." text
  local d=$work/qwen2.5-$1
  local sj lj sh_ids ll_ids div
  sj=$(run 600 "$cli" generate "$d/bf16" --prompt-ids "$prompt" --max-tokens "$n_agree" --kv-cache-dtype f32 --json)
  sh_ids=$(/usr/bin/python3 -c 'import json,sys; print(",".join(map(str, json.loads(sys.argv[1])["token_ids"])))' "$sj")
  lj=$(run 600 "$greedy" "$d/bf16.gguf" "$prompt" "$n_agree" "$threads" "$sh_ids")
  printf '%s\n' "$lj" >"$work/llama_greedy.$1.out"  # its system_info line: the kernel paths
  ll_ids=$(sed -n 's/^ids: //p' <<<"$lj")
  div=$(sed -n 's/^divergence: //p' <<<"$lj")
  local n_sh
  n_sh=$(tr ',' '\n' <<<"$sh_ids" | grep -c .)
  if [[ -z "$div" ]]; then
    put "agree.$1" "identical, $n_sh of $n_sh greedy tokens"
    log "qwen2.5-$1: greedy tokens identical ($n_sh of $n_sh; shardlm $sh_ids)"
    return
  fi
  # First divergence at step s: shardlm's own logits there (prompt + the s common tokens).
  local s l_id s_id l_gap ctx sgap
  read -r s l_id s_id l_gap < <(awk '{print $2, $4, $7, $NF}' <<<"$div")
  ctx=$prompt
  if ((s > 0)); then ctx="$prompt,$(cut -d, -f1-"$s" <<<"$sh_ids")"; fi
  run 600 "$cli" generate "$d/bf16" --prompt-ids "$ctx" --max-tokens 1 --kv-cache-dtype f32 \
    --dump-logits "$work/shardlm_logits.f32" >/dev/null
  sgap=$(/usr/bin/python3 -c '
import sys, numpy as np
l = np.fromfile(sys.argv[1], dtype="<f4"); print("%.4f" % (l[int(sys.argv[2])] - l[int(sys.argv[3])]))' \
    "$work/shardlm_logits.f32" "$s_id" "$l_id")
  put "agree.$1" "first $s of $n_sh equal; at step $s llama.cpp picks $l_id by $l_gap logits over shardlm's $s_id, shardlm picks $s_id by $sgap"
  log "qwen2.5-$1: greedy tokens differ from step $s: $div; shardlm's gap there $sgap"
  log "  shardlm   $sh_ids"
  log "  llama.cpp $ll_ids"
}
for m in $models; do agreement "$m"; done

# --- llama.cpp's load logs: which buffer (CPU_REPACK, AMX, plain CPU) took each tensor ---------
llama_load_log() {  # $1 model size, $2 gguf type (bf16, Q4_0, Q8_0)
  run 600 "$lbin/llama-bench" -m "$work/qwen2.5-$1/$2.gguf" -t "$threads" -p 0 -n 1 -r 1 -v -o jsonl \
    >/dev/null 2>"$work/llama_load.$1.$2.err" || llama_failed_log "$work/llama_load.$1.$2.err" "llama-bench -v on $2.gguf"
}
llama_failed_log() { tail -5 "$1" >&2; die "$2 failed (log: $1)"; }
for m in $models; do
  llama_load_log "$m" bf16
  if [[ $m == 0.5b ]]; then llama_load_log "$m" Q4_0; llama_load_log "$m" Q8_0; fi
done

# --- rounds ------------------------------------------------------------------
jq_py() { /usr/bin/python3 -c "import json,sys
$1" "${@:2}"; }
llama_failed() { tail -5 "$work/llama.err" >&2; die "$1 failed (log: $work/llama.err)"; }
llama_tg() {  # $1 gguf, $2 key: llama-bench tg64
  local out
  out=$(run 900 "$lbin/llama-bench" -m "$1" -t "$threads" -p 0 -n 64 -r 1 -o jsonl 2>"$work/llama.err") ||
    llama_failed "llama-bench on $1"
  put "$2" "$(jq_py 'r = json.loads(sys.argv[1].strip().splitlines()[-1]); print(r["avg_ts"])' "$out")"
  put "$2.bytes" "$(jq_py 'r = json.loads(sys.argv[1].strip().splitlines()[-1]); print(r["model_size"])' "$out")"
}
llama_pp() {  # $1 gguf, $2 key: llama-bench pp512
  local out
  out=$(run 900 "$lbin/llama-bench" -m "$1" -t "$threads" -p 512 -n 0 -r 1 -o jsonl 2>"$work/llama.err") ||
    llama_failed "llama-bench on $1"
  put "$2" "$(jq_py 'r = json.loads(sys.argv[1].strip().splitlines()[-1]); print(r["avg_ts"])' "$out")"
}
# SHARDLM_KERNEL_REPORT for a run: its file under kernels/ in round 1 ("0.5b.shard.dec" →
# kernels/0.5b.dec.txt), off ("0") in the others.
kreport() { if [[ $round == 1 ]]; then echo "$work/kernels/${1/.shard./.}.txt"; else echo 0; fi; }
shard_decode() {  # $1 model dir, $2 key prefix, $3 batches, $4 context, $5 steps, [$6 tp]
  local out
  out=$(SHARDLM_KERNEL_REPORT=$(kreport "$2") run 900 "$cli" generate "$1" --decode-bench "$3" --decode-context "$4" --decode-steps "$5" \
    --tp "${6:-1}" --kv-cache-dtype bf16 --json)
  jq_py '
for line in sys.argv[1].strip().splitlines():
    r = json.loads(line)
    print("%s.%d\t%s" % (sys.argv[2], r["batch"], r["tok_per_s"]))
    print("%s.%d.bytes\t%s" % (sys.argv[2], r["batch"], r["weight_bytes_read_per_step"]))' "$out" "$2" >>"$results"
}
shard_pp() {  # $1 model dir, $2 key
  local out
  out=$(SHARDLM_KERNEL_REPORT=$(kreport "$2") run 900 "$build/bench/decode_bench" "$1" --prompt 512 --decode 1 --no-bandwidth)
  put "$2" "$(awk '/^prefill:/ {print $(NF-1)}' <<<"$out")"
}
llama_batched() {  # $1 gguf, $2 key prefix
  local out
  out=$(run 900 "$lbin/llama-batched-bench" -m "$1" -t "$threads" -tb "$threads" -c 4096 -b 2048 -ub 512 \
    -npp 128 -ntg 32 -npl 4,16 -pps --output-format jsonl 2>"$work/llama.err") ||
    llama_failed "llama-batched-bench on $1"
  jq_py '
for line in sys.argv[1].strip().splitlines():
    if line.startswith("{"):
        r = json.loads(line)
        print("%s.%d\t%s" % (sys.argv[2], r["pl"], r["speed_tg"]))' "$out" "$2" >>"$results"
}
llama_serve() {  # $1 gguf, $2 key: the serve row's workload, output tokens/s with prefill
  local out
  out=$(run 900 "$lbin/llama-batched-bench" -m "$1" -t "$threads" -tb "$threads" -c 4096 -b 2048 -ub 512 \
    -npp 128 -ntg 64 -npl 16 --output-format jsonl 2>"$work/llama.err") ||
    llama_failed "llama-batched-bench (serve workload) on $1"
  put "$2" "$(jq_py '
for line in sys.argv[1].strip().splitlines():
    if line.startswith("{"):
        r = json.loads(line)
        print(r["pl"] * r["tg"] / r["t"])' "$out")"
}
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
server_pid=""
stop_server() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM
shard_serve() {  # $1 model dir, $2 key, $3 round (seeds the prompts: each round's prompts differ)
  local port vocab
  port=$(free_port)
  vocab=$(jq_py 'print(json.load(open(sys.argv[1]))["vocab_size"])' "$1/config.json")
  SHARDLM_KERNEL_REPORT=$(kreport "$2") nice -n 5 "$cli" serve "$1" --port "$port" --max-num-seqs 16 --max-model-len 512 --kv-cache-memory 1GiB \
    >"$work/serve.log" 2>&1 &
  server_pid=$!
  local deadline=$((SECONDS + 300))
  until /usr/bin/python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
    "http://127.0.0.1:$port/health" 2>/dev/null; do
    kill -0 "$server_pid" 2>/dev/null || { tail -20 "$work/serve.log" >&2; die "shardlm serve exited (log: $work/serve.log)"; }
    ((SECONDS < deadline)) || { stop_server; die "shardlm serve not healthy within 300 s"; }
    sleep 0.5
  done
  run 900 "$cli" bench --base-url "http://127.0.0.1:$port" --endpoint completions --num-prompts 16 \
    --max-concurrency 16 --prompt-token-ids --vocab-size "$vocab" --input-len 128 --range-ratio 0 --output-len 64 \
    --seed "$((1000 + $3))" --save-result "$work/serve_bench.json" >"$work/serve_bench.log" 2>&1 ||
    { stop_server; tail -20 "$work/serve_bench.log" >&2; die "shardlm bench failed (log: $work/serve_bench.log)"; }
  stop_server
  put "$2" "$(jq_py 'print(json.load(open(sys.argv[1]))["output_throughput"])' "$work/serve_bench.json")"
  # Decode rate while all 16 stream: 16 tokens per median time-per-output-token (first token excluded).
  put "$2.tpot" "$(jq_py 'print(16e3 / json.load(open(sys.argv[1]))["median_tpot_ms"])' "$work/serve_bench.json")"
  # The same over the median gap between two tokens: a TPOT also holds the prefill steps of
  # requests that reached the engine after the first step began (before serve's burst admission,
  # --burst-window-ms, a burst split 14 + 2 gave TPOT 131 ms, median ITL 107), which
  # llama-batched-bench, prefilling every prompt first, never has.
  put "$2.itl" "$(jq_py 'print(16e3 / json.load(open(sys.argv[1]))["median_itl_ms"])' "$work/serve_bench.json")"
}

t_start=$SECONDS
for ((r = 1; r <= rounds; ++r)); do
  round=$r
  for m in $models; do
    d=$work/qwen2.5-$m
    log "round $r/$rounds, qwen2.5-$m (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    put "load.$r.$m" "$(cut -d' ' -f1 /proc/loadavg)"
    peak=$(run 300 "$build/bench/machine_peak" --threads "$threads" --json)
    put "bw.read" "$(jq_py 'print(json.loads(sys.argv[1])["read_GBps"] * 1e9)' "$peak")"
    put "fma" "$(jq_py 'print(json.loads(sys.argv[1])["fma_gflops"] * 1e9)' "$peak")"
    llama_tg "$d/bf16.gguf" "$m.llama.tg"
    shard_decode "$d/bf16" "$m.shard.dec" 1 1 64
    llama_pp "$d/bf16.gguf" "$m.llama.pp"
    shard_pp "$d/bf16" "$m.shard.pp"
    [[ $m == 0.5b ]] || continue
    llama_batched "$d/bf16.gguf" "$m.llama.batched"
    shard_decode "$d/bf16" "$m.shard.batched" 4,16 128 32
    shard_decode "$d/bf16" "$m.shard.tp2" 1 1 64 2
    llama_tg "$d/Q4_0.gguf" "$m.llama.q4_0"
    shard_decode "$d/awq" "$m.shard.awq" 1 1 64
    llama_tg "$d/Q8_0.gguf" "$m.llama.q8_0"
    shard_decode "$d/gptq-int8" "$m.shard.int8" 1 1 64
    shard_decode "$d/gptq-int8-lmhead" "$m.shard.int8lm" 1 1 64
    if [[ $serve == 1 ]]; then
      llama_serve "$d/bf16.gguf" "$m.llama.serve16"
      shard_serve "$d/bf16" "$m.shard.serve16" "$r"
    fi
  done
done
log "measured in $((SECONDS - t_start)) s; raw figures: $results"

# --- table ---------------------------------------------------------------------
/usr/bin/python3 "$root/bench/llama_cpp_table.py" "$results" "$work" --threads "$threads" --rounds "$rounds" \
  --models "$models" --serve "$serve"
/usr/bin/python3 "$root/bench/llama_cpp_paths.py" "$work" --models "$models"
