#!/usr/bin/env bash
# Configures and builds shardlm into build/ (or $BUILD_DIR). Extra args go to cmake.
# SHARDLM_CONFIGURE_ONLY=1: configure and stop (tests/integration/readme_commands_test.sh
# runs the README's two commands that way, in order, to check what their builds are configured with).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "$@"
[[ ${SHARDLM_CONFIGURE_ONLY:-0} == 1 ]] && exit 0
cmake --build "$build_dir" -j"$(nproc)"
