#!/bin/sh
# Mixed "devices" on one CPU host (issue #24): two MPI ranks of one TP=2
# group, rank 1 slowed to about half the speed of rank 0 with a CPU quota
# (cgroup v1 cpu.cfs_quota_us, or cgroup v2 cpu.max), then decode tokens/s
# with the even split against a split from the ranks' measured speeds.
#
# Method:
#  1. Each rank gets its own cores (taskset), SHARDLM_... threads follow the
#     affinity; rank 1's process joins the cgroup `shardlm-slow`, whose quota is
#     QUOTA_PCT percent of one period per core it has.
#  2. Speed of each rank: `shardlm generate --tp 1` decode tokens/s of the
#     model alone on rank 0's cores, and alone inside the slowed cgroup.
#  3. Decode tokens/s of `mpirun -np 2 shardlm generate --tp 2`, with no split
#     and with --tensor-split S0,S1 (the two speeds): decode = the extra tokens
#     of a long run over a short one ÷ the extra seconds, so load and prefill cancel.
#  4. Prints the speeds, both decode rates and their ratio. Not a test: it
#     never fails on timing (the issue expects the proportional split ≥ 1.3×).
# Needs root (cgroups), mpirun, and at least 2 cores; on a shared machine the
# figures move with the neighbours' load: run it idle.
#   bench/mixed_split_bench.sh [BUILD_DIR] [QUOTA_PCT=50]
set -eu
build=${1:-build}
quota_pct=${2:-50}
cli="$build/src/cli/shardlm"
cmake --build "$build" --target shardlm >/dev/null
ncores=$(nproc)
[ "$ncores" -ge 2 ] || { echo "needs at least 2 cores (found $ncores)"; exit 0; }
half=$((ncores / 2))
cores0="0-$((half - 1))"
cores1="$half-$((2 * half - 1))"
model="$build/bench/mixed_split_q05b_bf16"
if [ ! -f "$model/config.json" ]; then
  # Qwen2.5-0.5B's shape, 8 layers, a small vocabulary so the layers dominate.
  "$cli" make-model --like qwen2.5-0.5b --layers 8 --vocab 2048 --dtype bf16 --seed 1 --out "$model" >/dev/null
fi

# The slowed cgroup: QUOTA_PCT % of each of its cores.
period=100000
quota=$((period * half * quota_pct / 100))
if [ -d /sys/fs/cgroup/cpu ] && [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  cg=/sys/fs/cgroup/cpu/shardlm-slow
  mkdir -p "$cg"
  echo $period > "$cg/cpu.cfs_period_us"
  echo $quota > "$cg/cpu.cfs_quota_us"
  procs="$cg/cgroup.procs"
elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup/shardlm-slow
  mkdir -p "$cg"
  echo "$quota $period" > "$cg/cpu.max"
  procs="$cg/cgroup.procs"
else
  echo "no cgroup cpu controller here: cannot slow a rank"; exit 0
fi
trap 'rmdir "$cg" 2>/dev/null || true' EXIT

# A launcher per rank: its cores, and for rank 1 the cgroup.
wrap="$build/bench/mixed_split_rank.sh"
cat > "$wrap" <<WRAP
#!/bin/sh
rank=\${OMPI_COMM_WORLD_RANK:-0}
if [ "\$rank" = 1 ] || [ "\${SLOW:-0}" = 1 ]; then echo \$\$ > "$procs"; exec taskset -c $cores1 "\$@"; fi
exec taskset -c $cores0 "\$@"
WRAP
chmod +x "$wrap"

mpirun="mpirun --oversubscribe --allow-run-as-root --mca btl self,vader"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
prompt="--prompt-ids 3,141,59,26,5,35,8,9"
short=8
long=72

now() { date +%s.%N; }
# decode tokens/s of a command prefix: (long − short) tokens ÷ the extra seconds.
decode_rate() {
  t0=$(now); "$@" generate "$model" $prompt --max-tokens $short >/dev/null 2>&1; t1=$(now)
  "$@" generate "$model" $prompt --max-tokens $long >/dev/null 2>&1; t2=$(now)
  echo "$t0 $t1 $t2" | awk -v n=$((long - short)) '{ extra = ($3 - $2) - ($2 - $1); if (extra <= 0) extra = 1e-9; printf "%.2f", n / extra }'
}
decode_rate_split() {
  split=$1; shift
  t0=$(now); "$@" generate "$model" $prompt --max-tokens $short --tp 2 $split >/dev/null 2>&1; t1=$(now)
  "$@" generate "$model" $prompt --max-tokens $long --tp 2 $split >/dev/null 2>&1; t2=$(now)
  echo "$t0 $t1 $t2" | awk -v n=$((long - short)) '{ extra = ($3 - $2) - ($2 - $1); if (extra <= 0) extra = 1e-9; printf "%.2f", n / extra }'
}

fast=$(SLOW=0 decode_rate "$wrap" "$cli")
slow=$(SLOW=1 decode_rate "$wrap" "$cli")
echo "rank speeds alone (TP 1 decode tok/s): rank 0 on cores $cores0: $fast; rank 1 on cores $cores1 at $quota_pct% quota: $slow"
# Both ways a rank can wait in a collective (SHARDLM_COLLECTIVE_WAIT): OpenMPI's
# polling spends the throttled rank's quota while it waits for the other;
# passive waits give it back, as a slower device's idle time costs nothing.
for wait in spin passive; do
  export SHARDLM_COLLECTIVE_WAIT=$wait
  even=$(decode_rate_split "" $mpirun -x SHARDLM_COLLECTIVE_WAIT -np 2 "$wrap" "$cli")
  weighted=$(decode_rate_split "--tensor-split $fast,$slow" $mpirun -x SHARDLM_COLLECTIVE_WAIT -np 2 "$wrap" "$cli")
  echo "TP 2 decode tok/s, $wait waits: even split $even; --tensor-split $fast,$slow: $weighted"
  echo "$even $weighted" | awk -v w=$wait '{ printf "proportional / even (%s waits): %.2fx\n", w, $2 / $1 }'
done
