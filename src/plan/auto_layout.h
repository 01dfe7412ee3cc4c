// `-tp auto` on serve and generate: the layout plan recommends for the ranks
// this run has. A run cannot leave ranks idle (mpirun started them all), so
// only layouts of exactly n_ranks ranks (tp × pp × dp = n_ranks) compete;
// among those that fit, the best by plan's speed model for the objective
// (serve: throughput; generate: one stream's latency).
#pragma once

#include <string>

#include "loader/model_spec.h"
#include "plan/device_catalog.h"
#include "plan/planner.h"
#include "plan/sharding.h"

namespace shardlm {

struct AutoLayoutChoice {
  Layout layout;       // with plan's pp_layer_partition
  std::string reason;  // one line: what was chosen for which devices, and the runner-up
};

// max_dp: 1 for generate (one sequence: replicas would sit idle).
// Throws kOutOfMemory with plan's explanation when no layout of n_ranks fits,
// kInvalidArgument for bad inputs.
AutoLayoutChoice choose_auto_layout(const ModelSpec& spec, int n_ranks, const DeviceSpec& device, int n_nodes,
                                    const PlanOptions& options, int max_dp);

// A CPU rank as plan's device: `memory_bytes` of RAM, and the bandwidths of
// one socket's memory and of shared memory between processes (defaults, not
// measured: `assumed` is set).
DeviceSpec cpu_rank_device(int64_t memory_bytes);

}  // namespace shardlm
