#include "backend/cuda/cuda_graph.h"

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace shardlm::backend::cuda {

CudaGraphRunner::CudaGraphRunner(cudaStream_t stream, std::function<void(int)> enqueue_step)
    : stream_(stream), enqueue_step_(std::move(enqueue_step)) {}

CudaGraphRunner::~CudaGraphRunner() { clear(); }

void CudaGraphRunner::run_eager(int n_rows) { enqueue_step_(n_rows); }

void CudaGraphRunner::begin_capture(int bucket) {
  // Thread-local mode: other threads' legacy-stream work does not break the capture.
  SHARDLM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
}

void CudaGraphRunner::end_capture(int bucket) {
  cudaGraph_t graph = nullptr;
  SHARDLM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t st = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (st != cudaSuccess)
    fail(ErrorCode::kInternal, "CUDA graph for decode batch ", bucket, ": instantiation failed: ",
         cudaGetErrorName(st), " (", cudaGetErrorString(st), ")");
  if (auto it = graphs_.find(bucket); it != graphs_.end()) cudaGraphExecDestroy(it->second);
  graphs_[bucket] = exec;
}

void CudaGraphRunner::abandon_capture(int bucket) noexcept {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
  }
  cudaGetLastError();  // a failed capture leaves a sticky-free error behind
}

void CudaGraphRunner::replay(int bucket) {
  auto it = graphs_.find(bucket);
  if (it == graphs_.end()) fail(ErrorCode::kInternal, "CUDA graph for decode batch ", bucket, " was never captured");
  SHARDLM_CUDA_CHECK(cudaGraphLaunch(it->second, stream_));
}

void CudaGraphRunner::clear() noexcept {
  for (auto& [bucket, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace shardlm::backend::cuda
