// DeviceLocalComm: ranks that are threads of one process sharing ONE GPU.
// NCCL refuses two ranks on one device, yet the device check runs TP 2, 3, 4
// and 6 on a single H200 to prove the uneven layouts give the TP1 tokens; so
// those ranks exchange data through the device memory they share. Each rank
// has its own stream; ranks meet at a host barrier (with the collective
// timeout: a rank that never arrives becomes Error(kDistributed) naming the
// rank and the operation), and stream order across ranks is kept with CUDA
// events, so nothing waits on the host for the device.
//
// all_reduce is a reduce-scatter then all-gather over the ranks' buffers:
// rank r sums slice r of every buffer into its own, then copies the others'
// reduced slices. Buffers are device pointers on the group's device.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace shardlm {

class DeviceLocalGroup;

class DeviceLocalComm final : public Communicator {
 public:
  ~DeviceLocalComm() override;
  int rank() const override { return rank_; }
  int size() const override;
  using Communicator::all_gather;
  using Communicator::all_reduce_sum;
  // f32, bf16 or f16 in device memory; half types are summed in f32 and
  // rounded once, in rank order, so every rank gets the same bits.
  void all_reduce_sum(void* data, size_t count, DType dtype) override;
  void all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void send(const void* data, size_t bytes, int dst) override;
  void recv(void* data, size_t bytes, int src) override;
  void send_async(const void* data, size_t bytes, int dst) override { send(data, bytes, dst); }
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void abort(const char* what) noexcept override;

  cudaStream_t stream() const { return stream_; }
  // Enqueues this rank's collectives on `stream` (not owned; it must outlive
  // this communicator) instead of its own: a rank's backend passes its
  // stream, so each collective is ordered after the ops that wrote its
  // buffer and before those that read it, with no host wait.
  void use_stream(cudaStream_t stream);

 private:
  friend class DeviceLocalGroup;
  DeviceLocalComm(std::shared_ptr<DeviceLocalGroup> group, int rank);
  void reduce(void* data, size_t count, DType dtype, const std::string& what);
  void gather(const void* in, void* out, const std::vector<size_t>& counts, size_t elem, const std::string& what);
  // Records this rank's event of `phase`, meets the others, and makes this
  // rank's stream wait for theirs.
  void sync_phase(int phase, const std::string& what);

  std::shared_ptr<DeviceLocalGroup> group_;
  int rank_;
  cudaStream_t stream_ = nullptr;      // where collectives are enqueued
  cudaStream_t own_stream_ = nullptr;  // created here; destroyed with the communicator
};

// The shared state of one group; make() returns rank r's communicator (call
// from rank r's thread, after cudaSetDevice(device)).
class DeviceLocalGroup : public std::enable_shared_from_this<DeviceLocalGroup> {
 public:
  static std::shared_ptr<DeviceLocalGroup> create(int n_ranks, int device);
  std::unique_ptr<DeviceLocalComm> make(int rank);
  int size() const { return n_; }
  int device() const { return device_; }
  ~DeviceLocalGroup();

 private:
  friend class DeviceLocalComm;
  DeviceLocalGroup(int n_ranks, int device);
  // Host barrier with the collective timeout; throws when a rank aborted or time ran out.
  void arrive(int rank, const std::string& what);

  int n_, device_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::string aborted_;  // "" or "rank r: reason"
  static constexpr int kPhases = 3;
  std::vector<cudaEvent_t> events_;  // [kPhases][n]
  std::vector<void*> ptrs_;           // what each rank published for the current collective
  std::vector<int> colors_, keys_;    // split()
  std::vector<std::shared_ptr<DeviceLocalGroup>> children_;
  // Point to point: mailbox[src * n + dst] holds staged device copies in order.
  struct Message {
    void* buffer;
    size_t bytes;
    cudaEvent_t ready;
  };
  std::vector<std::vector<Message>> mailbox_;
};

}  // namespace shardlm
