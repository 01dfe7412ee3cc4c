// --tensor-parallel-size N | auto, for serve and generate. "auto" asks plan
// (plan/auto_layout.h) for the layout of the ranks this run has: the
// processes mpirun started, or one rank without mpirun (threads of one
// process share one memory and one set of cores: splitting them buys
// nothing on the CPU backend). Each rank is planned as a device holding
// this host's RAM divided by the ranks on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "comm/communicator.h"
#include "loader/model_spec.h"
#include "plan/auto_layout.h"
#include "plan/sharding.h"

namespace shardlm::cli {

// Sentinel degree for "auto" in a Layout until it is resolved.
constexpr int kAutoDegree = 0;

// "auto" -> kAutoDegree; "1".."4096" -> the degree. Throws kInvalidArgument
// naming --tensor-parallel-size otherwise.
int parse_tp_flag(const std::string& text);

// -tp auto cannot be combined with explicit -pp/-dp/--pp-layer-partition.
void check_auto_alone(bool tp_auto, int pp, int dp, bool has_partition);

// Ranks of this run (mpirun's world size, else 1), ranks on this host, and hosts.
struct RunRanks {
  int n_ranks = 1;
  int n_local = 1;
  int n_nodes = 1;
};
RunRanks run_ranks();

// Plans the layout for `ranks` (see the header comment). memory_utilization:
// the fraction of each rank's RAM share plan may use (serve's
// --gpu-memory-utilization, 0.9 when not given).
AutoLayoutChoice plan_auto_layout(const ModelSpec& spec, const RunRanks& ranks, PlanOptions options, int max_dp);

// Under mpirun: rank 0 runs choose() and every rank of `world` returns its
// layout (hosts may differ in RAM, so they must not decide apart). When
// rank 0 throws, the others throw too, pointing at rank 0's message.
Layout agree_on_layout(Communicator& world, const std::function<Layout()>& choose);

// Physical RAM of this host.
int64_t host_memory_bytes();

}  // namespace shardlm::cli
