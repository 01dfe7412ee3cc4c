// `shardlm serve` under mpirun: the world of tp × pp × dp processes splits
// into dp replicas (tp fastest, then pp, then dp). Each replica's driver
// (tp 0, pp 0) runs the usual server with dp = 1 on --port + replica index,
// its executor an MpiGroupExecutor; the other ranks only run the model
// (run_worker). Rank 0 logs the `shardlm router` line that fronts the
// replicas. Without mpirun (or with one process) every call is a no-op.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "plan/sharding.h"
#include "server/engine_backend.h"

namespace shardlm {
class Communicator;
class MpiRuntime;
}

namespace shardlm::cli {

class ServeMpi {
 public:
  // Initialises MPI when started by mpirun with more than one process.
  // Collective over the world then. layout.tp == kAutoDegree (-tp auto):
  // choose_auto() picks the layout (on rank 0 under mpirun, agreed by all).
  // Throws kInvalidArgument when the world size is not tp × pp × dp (naming
  // both).
  ServeMpi(const std::string& model_dir, const Layout& layout, const std::string& host, int port,
           const std::function<Layout()>& choose_auto = {});
  ~ServeMpi();

  bool active() const { return world_ != nullptr; }
  int world_rank() const;  // 0 without mpirun
  // This process's device (cpu, or its GPU); call before run_worker/attach.
  void set_device(const Device& device) { device_ = device; }
  const Layout& layout() const { return layout_; }  // resolved (never auto)
  bool is_driver() const;
  // Non-driver ranks: load the shard, run batches until the driver stops.
  int run_worker();
  // Driver: serve this replica only (dp = 1) over an MpiGroupExecutor.
  void attach(server::EngineBackendOptions* options);
  // The port this process serves on: port + replica index.
  int port() const;

 private:
  std::string model_dir_;
  Layout layout_;
  std::string host_;
  int port_;
  int dp_rank_ = 0;
  Device device_;
  std::unique_ptr<MpiRuntime> runtime_;
  std::unique_ptr<Communicator> world_;
};

}  // namespace shardlm::cli
