// NcclComm: the Communicator over NCCL, for GPU ranks (only with -DSHARDLM_CUDA=ON).
//
// One process per GPU under mpirun, the way CPU ranks run today: each rank
// owns one device, its CUDA context and its NCCL communicator, exactly what
// NCCL expects (a communicator needs a distinct device per rank), and a
// crashed rank is a dead process that mpirun and the watchdog both see. The
// NCCL unique id is made on rank 0 and broadcast over MPI.
//
// Buffers are device pointers. Every collective is enqueued on this rank's
// stream and then waited for through wait_for_collective
// (comm/collective_watchdog.h): NCCL's asynchronous errors
// (ncclCommGetAsyncError) and timeouts become Error(kDistributed) naming the
// rank and the operation, and the communicator is aborted so peers stop too.
// The communicator is created non-blocking, so even its setup is watched.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardlm {

class NcclComm final : public Communicator {
 public:
  // Collective over mpi_comm: rank r of it uses CUDA device `device`.
  // Logs (stderr, rank 0) the NCCL version and the interconnect between each pair of ranks.
  static std::unique_ptr<NcclComm> create(MPI_Comm mpi_comm, int device);
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  using Communicator::all_gather;
  using Communicator::all_reduce_sum;
  // f32, bf16 or f16 in device memory. Half types are summed by NCCL in their
  // own precision (a ring rounds at each hop), not in f32 as the CPU
  // communicators do; every rank still gets the same bits.
  void all_reduce_sum(void* data, size_t count, DType dtype) override;
  void all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(const void* data, size_t bytes, int dst) override;
  void recv(void* data, size_t bytes, int src) override;
  void send_async(const void* data, size_t bytes, int dst) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const char* what) noexcept override;

  cudaStream_t stream() const { return stream_; }
  // Enqueues this rank's collectives and receives on `stream` (not owned; it
  // must outlive this communicator) instead of its own: the rank's backend
  // passes its stream, so each collective starts after the ops that wrote its
  // buffer (and wait() then covers them too).
  void use_stream(cudaStream_t stream);
  // "rank 0 ↔ rank 1: same host, P2P (cudaDeviceCanAccessPeer)" lines, made at create().
  const std::vector<std::string>& links() const { return links_; }

 private:
  NcclComm(ncclComm_t comm, int rank, int size, int device);
  // Enqueued NCCL work on stream_ is complete, or the rank/op error is thrown.
  void wait(const std::string& what);
  void check(ncclResult_t r, const std::string& what);
  void gather_typed(const void* in, void* out, const std::vector<size_t>& counts, ncclDataType_t type,
                    size_t elem_bytes, const char* name);

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  cudaStream_t stream_ = nullptr;      // where collectives are enqueued
  cudaStream_t own_stream_ = nullptr;  // created here, destroyed with the communicator
  cudaStream_t send_stream_ = nullptr;  // send_async: its own stream, so order per destination holds
  cudaEvent_t done_ = nullptr;
  float* scratch_ = nullptr;  // one float for barrier()
  struct Staged {
    void* buffer;
    cudaEvent_t sent;
  };
  std::deque<Staged> staged_;  // send_async copies still in flight
  std::chrono::milliseconds timeout_;
  std::vector<std::string> links_;
  bool aborted_ = false;
};

}  // namespace shardlm
