#!/usr/bin/env bash
# The CLI's libgomp wait default (src/cli/main.cpp): a model command started
# with neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT set runs with
# GOMP_SPINCOUNT=10000 (spin, then sleep); either variable given is kept.
#   env: SHARDLM_CLI (ctest sets it)
set -uo pipefail
: "${SHARDLM_CLI:?}"
fail() { echo "FAIL: $*" >&2; exit 1; }
# The process's own environment, read while it runs: `shardlm generate` on
# the demo model with a prompt long enough to be caught in flight is racy, so
# serve is started and asked for /health (an event) before /proc is read.
check() {  # expected-line env-assignments...
  local want=$1; shift
  local port log pid
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  log=$(mktemp)
  env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$@" "$SHARDLM_CLI" serve --port "$port" --kv-cache-memory 16MiB >"$log" 2>&1 &
  pid=$!
  # Waits for the event (/health answers, or serve exits); the 60 s bound only
  # names a hang before ctest's timeout would.
  local deadline=$((SECONDS + 60))
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "serve exited"; }
    ((SECONDS < deadline)) || { kill "$pid"; cat "$log" >&2; fail "serve did not answer /health in 60 s"; }
    sleep 0.2  # the poll interval, not a wait for something to happen
  done
  local got
  got=$(tr '\0' '\n' </proc/$pid/environ | grep -E '^(GOMP_SPINCOUNT|OMP_WAIT_POLICY)=' | sort | tr '\n' ' ')
  kill "$pid"; wait "$pid" 2>/dev/null; rm -f "$log"
  [[ $got == "$want " ]] || fail "with '$*': environment has '$got', expected '$want'"
  echo "ok: with '$*': $got"
}
check "GOMP_SPINCOUNT=10000"
check "OMP_WAIT_POLICY=passive" OMP_WAIT_POLICY=passive
check "GOMP_SPINCOUNT=500" GOMP_SPINCOUNT=500
