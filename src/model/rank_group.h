// The ranks of one TP × PP group as threads of this process, each with its
// backend and its communicators, on the CPU or on one GPU. generate,
// perplexity and the serve executor run their ranks through it.
//
// On the CPU every communicator is a LocalComm. On a GPU the ranks share the
// one device (threads cannot each own a GPU under NCCL's one-device-per-rank
// rule): the model's tp and pp groups are device-local communicators
// (comm/cuda) over device buffers, bound to each rank's backend stream so
// that collectives are ordered with the ops around them; `world` stays a host
// LocalComm for the driver's control messages (the token it picked).
// GPUs in separate processes (mpirun, NCCL) go through MpiGroupExecutor.
#pragma once

#include <functional>
#include <memory>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "model/causal_lm.h"
#include "plan/sharding.h"

namespace shardlm {

struct RankContext {
  Communicator& world;  // host memory: control messages between the group's ranks
  RankComms comms;      // the model's tensor-parallel and pipeline groups (the backend's buffers)
  std::shared_ptr<backend::Backend> backend;
  int tp_rank = 0, pp_rank = 0;
  std::unique_ptr<Communicator> device_world;  // on a GPU: the device-local world comms was split from
  // Stops the rank's peers blocked in any of its communicators (after a failure). Never throws.
  void abort(const char* what) noexcept;
};

// The group-wide part, made once per group (before its threads start); each
// rank's thread then calls make() with its host world communicator
// (collective: every rank of the group must call it).
class RankGroupFactory {
 public:
  // Throws Error(kUnsupported) for a GPU layout this build cannot run as threads.
  // batch_invariant: every rank's backend runs its batch-invariant kernels
  // (make_backend refuses a backend without them).
  RankGroupFactory(const Layout& layout, Device device, int n_threads_per_rank, bool batch_invariant = false);
  RankContext make(Communicator& world) const;
  const Device& device() const { return device_; }

 private:
  Layout layout_;
  Device device_;
  int n_threads_per_rank_;
  bool batch_invariant_;
  std::shared_ptr<void> device_group_;  // DeviceLocalGroup (GPU, more than one rank)
};

// Runs body on layout.tp × layout.pp threads (world rank = pp_rank × tp +
// tp_rank). n_threads_per_rank: CPU threads of each rank's ops (ignored on a
// GPU). A failure on any rank stops the others and is rethrown here as
// Error(kDistributed) naming the rank. Throws Error(kUnsupported) for a GPU
// layout this build cannot run as threads (pipeline stages on one GPU; TP
// without the device-local communicator, i.e. a build without MPI).
void run_rank_group(const Layout& layout, Device device, int n_threads_per_rank,
                    const std::function<void(RankContext&)>& body, bool batch_invariant = false);

// True when this build can run layout's ranks as threads on a GPU.
bool device_group_supported(const Layout& layout, std::string* why);

}  // namespace shardlm
