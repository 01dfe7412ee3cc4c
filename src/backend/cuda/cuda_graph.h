// The CUDA side of DecodeGraphCache (backend/device/graph_buckets.h): one
// instantiated graph per decode batch-size bucket, captured from a stream.
// The step itself comes from the caller (a callback that enqueues one decode
// step padded to n rows on the stream); every buffer it touches must keep its
// address across replays (they are allocated once, per bucket's max size).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>

#include "backend/device/graph_buckets.h"

namespace shardlm::backend::cuda {

class CudaGraphRunner final : public GraphStepRunner {
 public:
  CudaGraphRunner(cudaStream_t stream, std::function<void(int n_rows)> enqueue_step);
  ~CudaGraphRunner() override;

  void run_eager(int n_rows) override;
  void begin_capture(int bucket) override;
  void end_capture(int bucket) override;  // throws with CUDA's reason when capture or instantiation fails
  void abandon_capture(int bucket) noexcept override;
  void replay(int bucket) override;
  // Destroys every graph (call with DecodeGraphCache::invalidate()).
  void clear() noexcept override;

 private:
  cudaStream_t stream_;
  std::function<void(int)> enqueue_step_;
  std::map<int, cudaGraphExec_t> graphs_;
};

}  // namespace shardlm::backend::cuda
