// LocalComm: ranks are threads of one process sharing memory. Used for
// tensor/pipeline parallelism inside one process (tests, `generate -tp N`
// without MPI) and for the collectives' reference semantics.
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"

namespace shardlm {

class LocalWorld;  // shared state of the ranks; defined in local_comm.cpp

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalWorld> world, int rank);
  ~LocalComm() override;
  int rank() const override { return rank_; }
  int size() const override;
  using Communicator::all_gather;
  using Communicator::all_reduce_sum;
  void all_reduce_sum(void* data, size_t count, DType dtype) override;
  void all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(const void* data, size_t bytes, int dst) override;
  void recv(void* data, size_t bytes, int src) override;
  // Sends are already buffered (a mailbox per rank pair): the same as send.
  void send_async(const void* data, size_t bytes, int dst) override { send(data, bytes, dst); }
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const char* what) noexcept override;

  // One communicator per rank of a new world of n_ranks.
  static std::vector<std::unique_ptr<LocalComm>> create_world(int n_ranks);

 private:
  std::shared_ptr<LocalWorld> world_;
  int rank_;
};

// Runs body(comm) on n_ranks threads. If any rank throws, the world is
// aborted so the others stop instead of waiting, and the first failure is
// rethrown here as Error(kDistributed) naming its rank.
void run_local_ranks(int n_ranks, const std::function<void(Communicator&)>& body);

}  // namespace shardlm
