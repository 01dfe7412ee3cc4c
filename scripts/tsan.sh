#!/usr/bin/env bash
# ThreadSanitizer over the threaded layers: the engine (its loop thread and
# the submitting threads, LocalGroupExecutor's rank threads and restart),
# comm (LocalComm), server (HTTP workers, streams, disconnects), router
# (upstream readers) and the engine's host workers (sampling threads).
# Separate from scripts/test.sh: a TSan build of these targets is another
# full compile (see the timing it prints). As in the ASan
# pass, only the hot code (cmake/shardlm.cmake) is built at -O1, the rest at -O0.
#   BUILD_DIR (default build-tsan); extra args go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build-tsan}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t0=$(date +%s)
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSHARDLM_TSAN=ON -DSHARDLM_NATIVE=OFF -DSHARDLM_BENCH=OFF \
  -DSHARDLM_MPI=OFF -DSHARDLM_CUDA=OFF -DSHARDLM_SANITIZE=OFF -DCMAKE_CXX_FLAGS=-O0 -DSHARDLM_HOT_CXX_FLAGS=-O1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 > /dev/null
targets=(shardlm engine_test mpi_group_executor_test local_comm_test http_server_test router_test serve_faults_test)
cmake --build "$build_dir" -j"$(nproc)" --target "${targets[@]}"
t1=$(date +%s)
# libgomp (OpenMP in the CPU kernels) is not instrumented: its barriers look
# like races to TSan. OMP_NUM_THREADS=1 caps every rank's kernels to one
# thread (backend::set_num_threads honours it), so no OpenMP team starts.
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# report_mutex_bugs=0: see scripts/tsan.supp (httplib's mutexes); data races
# and lock-order inversions are still reported.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 report_mutex_bugs=0 suppressions=$PWD/scripts/tsan.supp ${TSAN_OPTIONS:-}"
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" --timeout 900 \
  -R '(Engine|HostWorkers|EngineGrammar|EngineFaults|SamplerFaults|StopStrings|Metrics|MpiBatchWire|MpiExecutorThreads|LocalComm|LocalCommTest|HttpServerTest|SlowClientTest|HttpServerBind|RoutingPolicy|Router|RouterTest|RouterSlowStreamTest|ServeFaults)\.' \
  "$@"
t2=$(date +%s)
echo "tsan.sh: build $((t1 - t0)) s, tests $((t2 - t1)) s"
