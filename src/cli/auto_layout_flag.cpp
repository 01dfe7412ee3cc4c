#include "cli/auto_layout_flag.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <vector>
#include <string>

#include "comm/mpi_comm.h"
#include "core/error.h"

namespace shardlm::cli {

int parse_tp_flag(const std::string& text) {
  if (text == "auto") return kAutoDegree;
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < 1 || v > 4096)
    fail(ErrorCode::kInvalidArgument, "--tensor-parallel-size \"", text,
         "\": give a degree from 1 to 4096, or auto to let plan choose the layout");
  return static_cast<int>(v);
}

void check_auto_alone(bool tp_auto, int pp, int dp, bool has_partition) {
  if (tp_auto && (pp != 1 || dp != 1 || has_partition))
    fail(ErrorCode::kInvalidArgument, "-tp auto chooses TP, PP and DP together; drop -pp/-dp/--pp-layer-partition/--tensor-split, ",
         "or give every degree yourself (`shardlm plan` lists the layouts)");
}

RunRanks run_ranks() {
  RunRanks r;
  if (!launched_by_mpirun()) return r;
  auto env_int = [](const char* name) {
    const char* s = std::getenv(name);
    return s ? std::max(1, std::atoi(s)) : 1;
  };
  r.n_ranks = env_int("OMPI_COMM_WORLD_SIZE");
  r.n_local = std::min(r.n_ranks, env_int("OMPI_COMM_WORLD_LOCAL_SIZE"));
  // mpirun fills hosts evenly in the common case; otherwise plan one host.
  r.n_nodes = r.n_ranks % r.n_local == 0 ? r.n_ranks / r.n_local : 1;
  return r;
}

Layout agree_on_layout(Communicator& world, const std::function<Layout()>& choose) {
  // [ok, tp, pp, dp, n_stages, expert_parallel, partition...]; at most 4096 stages.
  std::vector<int64_t> msg(6 + 4096, 0);
  std::exception_ptr error;
  if (world.rank() == 0) {
    try {
      const Layout l = choose();
      msg[0] = 1;
      msg[1] = l.tp;
      msg[2] = l.pp;
      msg[3] = l.dp;
      msg[4] = static_cast<int64_t>(l.pp_layer_partition.size());
      msg[5] = l.expert_parallel ? 1 : 0;
      std::copy(l.pp_layer_partition.begin(), l.pp_layer_partition.end(), msg.begin() + 6);
    } catch (...) {
      error = std::current_exception();
    }
  }
  world.broadcast(msg.data(), msg.size() * sizeof(int64_t), 0);
  if (error) std::rethrow_exception(error);
  if (msg[0] != 1)
    fail(ErrorCode::kInvalidArgument, "-tp auto: rank 0 could not choose a layout (its message says why)");
  Layout l;
  l.tp = static_cast<int>(msg[1]);
  l.pp = static_cast<int>(msg[2]);
  l.dp = static_cast<int>(msg[3]);
  l.expert_parallel = msg[5] != 0;
  l.pp_layer_partition.assign(msg.begin() + 6, msg.begin() + 6 + msg[4]);
  return l;
}

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;
}

AutoLayoutChoice plan_auto_layout(const ModelSpec& spec, const RunRanks& ranks, PlanOptions options, int max_dp) {
  options.budget.reserve_bytes = 0;  // CPU ranks: no CUDA context or NCCL buffers
  const DeviceSpec device = cpu_rank_device(host_memory_bytes() / ranks.n_local);
  return choose_auto_layout(spec, ranks.n_ranks, device, ranks.n_nodes, options, max_dp);
}

}  // namespace shardlm::cli
