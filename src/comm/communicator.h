// Collective and point-to-point communication between ranks. Model code takes
// a Communicator& and every collective is visible where it happens; there is
// no global rank state. Implementations: LocalComm (ranks are threads of one
// process), MpiComm (OpenMPI processes on one or several hosts).
//
// Every call is collective over the communicator's ranks unless it is send or
// recv. A failure on any rank (exception, dead process, timeout) makes the
// others throw Error(kDistributed) naming the rank instead of hanging.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace shardlm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Buffers are the rank's device buffers (host memory for CPU ranks; device
  // memory for a GPU communicator) of `dtype` elements: f32, bf16 or f16.
  // data[i] = sum over ranks of data[i]; in place, [count] elements. Half
  // types are summed in f32 and rounded once, in rank order, so every rank
  // gets the same bits.
  virtual void all_reduce_sum(void* data, size_t count, DType dtype) = 0;
  // out = concatenation over ranks r of in_r, where rank r contributes
  // counts[r] elements (counts is the same on every rank). out: [sum(counts)].
  virtual void all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) = 0;

  void all_reduce_sum(float* data, size_t count) { all_reduce_sum(data, count, DType::kF32); }
  void all_gather(const float* in, float* out, const std::vector<size_t>& counts) {
    all_gather(in, out, counts, DType::kF32);
  }
  // A whole tensor, in place.
  void all_reduce_sum(Tensor& t) { all_reduce_sum(t.data(), static_cast<size_t>(t.numel()), t.dtype()); }
  // Copies root's bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void send(const void* data, size_t bytes, int dst) = 0;
  virtual void recv(void* data, size_t bytes, int src) = 0;
  // Like send, but returns without waiting for dst to post its recv: the
  // bytes are copied first, so `data` may be reused at once. Pipeline stages
  // send this way: a ring of ranks that each send before they receive (stage
  // to stage, last stage back to the driver) cannot then deadlock on
  // rendezvous sends. Messages from one rank to another keep their order,
  // mixed with plain sends.
  virtual void send_async(const void* data, size_t bytes, int dst) = 0;
  virtual void barrier() = 0;
  // Ranks passing the same color form a new communicator, ordered by key
  // (MPI_Comm_split). Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Tells every peer this rank failed (what: the reason), so their pending
  // and future calls throw instead of waiting. Never throws.
  virtual void abort(const char* what) noexcept = 0;
};

// A world of one rank: every collective is the identity.
class SoloComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  using Communicator::all_gather;
  using Communicator::all_reduce_sum;
  void all_reduce_sum(void*, size_t, DType) override {}
  void all_gather(const void* in, void* out, const std::vector<size_t>& counts, DType dtype) override;
  void broadcast(void*, size_t, int) override {}
  void send(const void*, size_t, int dst) override;
  void recv(void*, size_t, int src) override;
  void send_async(const void* data, size_t bytes, int dst) override { send(data, bytes, dst); }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SoloComm>(); }
  void abort(const char*) noexcept override {}
};

}  // namespace shardlm
