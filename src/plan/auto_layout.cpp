#include "plan/auto_layout.h"

#include <sstream>

#include "core/error.h"
#include "core/units.h"
#include "plan/explain.h"

namespace shardlm {

DeviceSpec cpu_rank_device(int64_t memory_bytes) {
  DeviceSpec d;
  d.name = "CPU rank (" + format_gib(static_cast<double>(memory_bytes)) + ")";
  d.memory_bytes = memory_bytes;
  d.memory_bandwidth = 50e9;  // a DDR4/DDR5 socket, order of magnitude
  d.link_bandwidth = 10e9;    // shared-memory copies between processes
  d.link_name = "shared memory";
  d.assumed = true;
  return d;
}

AutoLayoutChoice choose_auto_layout(const ModelSpec& spec, int n_ranks, const DeviceSpec& device, int n_nodes,
                                    const PlanOptions& options, int max_dp) {
  if (n_ranks < 1) fail(ErrorCode::kInvalidArgument, "-tp auto: the run has ", n_ranks, " ranks");
  if (n_nodes < 1 || n_ranks % n_nodes != 0)
    fail(ErrorCode::kInvalidArgument, "-tp auto: ", n_ranks, " ranks cannot be split evenly over ", n_nodes, " hosts");
  DeviceInventory inventory;
  inventory.devices.assign(static_cast<size_t>(n_ranks), device);
  inventory.n_nodes = n_nodes;
  const Plan plan = make_plan(spec, inventory, options, "the model");
  const LayoutEvaluation* best = nullptr;
  const LayoutEvaluation* second = nullptr;
  for (const LayoutEvaluation& e : plan.layouts) {
    if (!e.fits || e.idle_devices != 0 || e.layout.dp > max_dp) continue;
    const double score = objective_score(e, options.objective);
    if (!best || score > objective_score(*best, options.objective)) {
      second = best;
      best = &e;
    } else if (!second || score > objective_score(*second, options.objective)) {
      second = &e;
    }
  }
  if (!best) {
    std::ostringstream why;
    why << "-tp auto: no layout of exactly " << n_ranks << " rank(s) of " << device.name << " fits";
    for (const std::string& p : explain_plan(plan))
      if (p.rfind("Nothing fits", 0) == 0) why << ". " << p;
    why << " Give more ranks (mpirun -np N), more memory per rank, or a smaller --max-model-len.";
    fail(ErrorCode::kOutOfMemory, why.str());
  }
  AutoLayoutChoice c;
  c.layout = best->layout;
  std::ostringstream r;
  const bool latency = options.objective == Objective::kLatency;
  auto tok_s = [&](const LayoutEvaluation& e) { return latency ? e.single_stream_tok_s : e.aggregate_tok_s; };
  r << std::fixed;
  r.precision(0);
  r << "-tp auto: plan chose " << best->layout.to_string() << " for " << n_ranks << " × " << device.name << " ("
    << objective_name(options.objective) << ": " << tok_s(*best) << " tok/s modelled";
  if (second) r << "; next best " << second->layout.to_string() << " at " << tok_s(*second) << " tok/s";
  r << "; max-model-len " << best->max_model_len << ")";
  c.reason = r.str();
  return c;
}

}  // namespace shardlm
