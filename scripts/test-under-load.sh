#!/usr/bin/env bash
# Proof that the tests which involve time, servers and faults do not depend
# on this machine's speed: runs them (ctest regex below) three ways, each
# --rounds times, and prints one line per run and a summary.
#   busy     both cores kept busy by a competing load (stress-ng, else shell loops)
#   onecore  everything on one core: taskset -c 0 (client and server together)
#   asan     the ASan+UBSan build (slow start-up, slow code), without the
#            tests labelled integration, as scripts/test.sh's ASan pass: the
#            1,000-stream loads measure an ASan server's throughput against
#            a fixed time budget
# Usage: scripts/test-under-load.sh [--rounds 3] [--modes busy,onecore,asan]
#          [--build build] [--asan-build build-asan]
# The builds must exist (scripts/build.sh; the ASan one as scripts/test.sh
# makes it). Exits non-zero if any run failed. Not part of scripts/test.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=3 modes=busy,onecore,asan build=build asan_build=build-asan
while (($#)); do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --asan-build) asan_build=$2; shift 2 ;;
    *) echo "test-under-load.sh: unknown argument '$1' (see the header of this script)" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The timing binary, the server and router suites, serve's fault tests,
# the engine's fault tests, the load generator, and the 1,000-stream loads.
tests='^(loadgen_timing_test|load_1000_streams|load_1000_streams_router|serve_bench_smoke|HttpServerTest\.|SlowClientTest\.|ApiSurfaceTest\.|HostileInputTest\.|HostileTemplateTest\.|AnthropicTest\.|ResponsesTest\.|WebUiTest\.|RouterWebUi\.|RouterTest\.|Router\.|ServeFaults\.|EngineFaults\.|SseParser\.|Stats\.|Metrics\.|Dataset\.|Arrivals\.)'

load_pids=()
start_load() {
  local n; n=$(nproc)
  if command -v stress-ng >/dev/null; then
    stress-ng --cpu "$n" --quiet & load_pids+=($!)
  else
    for ((i = 0; i < n; i++)); do (while :; do :; done) & load_pids+=($!); done
  fi
}
stop_load() {
  ((${#load_pids[@]})) && kill "${load_pids[@]}" 2>/dev/null
  wait "${load_pids[@]}" 2>/dev/null
  load_pids=()
}
trap stop_load EXIT

declare -A passed failed
log_dir=$(mktemp -d /tmp/test-under-load.XXXXXX)
for mode in ${modes//,/ }; do
  passed[$mode]=0 failed[$mode]=0
  for ((round = 1; round <= rounds; round++)); do
    dir=$build jobs=$(nproc) wrap=() label_filter=()
    case "$mode" in
      busy) start_load ;;
      onecore) wrap=(taskset -c 0) jobs=1 ;;
      asan) dir=$asan_build label_filter=(-LE 'slow|reference|integration') ;;
      *) echo "test-under-load.sh: unknown mode '$mode' (busy, onecore, asan)" >&2; exit 2 ;;
    esac
    if [[ ! -f $dir/CTestTestfile.cmake ]]; then
      echo "test-under-load.sh: no build in $dir for mode $mode (build it first)" >&2; exit 2
    fi
    log=$log_dir/$mode.$round.log
    t0=$SECONDS
    "${wrap[@]}" ctest --test-dir "$dir" -j"$jobs" --timeout 900 --output-on-failure -R "$tests" "${label_filter[@]}" \
      >"$log" 2>&1
    rc=$?
    [[ $mode == busy ]] && stop_load
    summary=$(grep -E '^[0-9]+% tests passed' "$log" || echo "no ctest summary")
    if ((rc == 0)); then passed[$mode]=$((passed[$mode] + 1)); else failed[$mode]=$((failed[$mode] + 1)); fi
    echo "$mode round $round: rc=$rc, $summary, $((SECONDS - t0)) s (log: $log)"
    ((rc == 0)) || grep -E '^\s+[0-9]+ - |\*\*\*Failed|Timeout' "$log" | head -20
  done
done
status=0
for mode in ${modes//,/ }; do
  echo "$mode: ${passed[$mode]} of $rounds rounds passed"
  ((failed[$mode] == 0)) || status=1
done
exit $status
