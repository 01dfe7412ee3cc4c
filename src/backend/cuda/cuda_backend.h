// The CUDA implementation of Backend (only with -DSHARDLM_CUDA=ON): one
// object per rank, owning its device, its stream, a cuBLASLt handle and the
// measured allocations of the rank.
//
// Dtypes. Weights stay bf16 on the device as the checkpoint stores them
// (never widened; a weight of any other dtype is refused, naming it). The
// residual stream and every activation the interface hands between ops are
// f32 (activation_dtype() == kF32), as our kernels keep them (kernels.h):
// GEMM inputs are rounded to bf16 right before the tensor-core GEMM, the KV
// cache is bf16, attention scores and norms are f32. Keeping the interface's
// activations f32 costs one extra read and write of [n_tokens, d] per GEMM
// input and per bf16 kernel output (small beside a decode step's weight
// reads) and keeps the tokens close to the CPU backend's.
//
// Memory. Every allocation is measured by what the driver says was taken
// (DeviceMemoryAccounting over cudaMemGetInfo deltas, serialised across the
// ranks of one process so that threads sharing a GPU do not see each other's
// allocations), never recomputed: allocated_bytes() is that measurement.
//
// Ordering. Ops are enqueued on the backend's stream; download() and
// synchronize() wait for it. A communicator working on device buffers must
// use the same stream (device_stream()), or synchronize before it.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/device/memory_accounting.h"

namespace shardlm::backend::cuda {

// The measured allocator shared by a backend and its tensors' deleters (a
// tensor may outlive its backend).
struct CudaAllocState;

class CudaBackend final : public Backend {
 public:
  // device: the CUDA ordinal. Throws kInvalidArgument when it does not exist,
  // kUnsupported when no CUDA device is usable (with the runtime's reason).
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device{DeviceKind::kCuda, device_}; }
  std::string name() const override { return name_; }
  DType activation_dtype() const override { return DType::kF32; }
  cudaStream_t stream() const { return stream_; }

  Tensor alloc(DType dtype, TensorShape shape) override;
  int64_t allocated_bytes() const override;
  Tensor adopt_weight(Tensor host) override;
  // One measured allocation of bytes + alignment for every tensor; adopt_weight
  // then places weights in it while they fit (and allocates separately after).
  void reserve_weights(int64_t bytes, int64_t n_tensors) override;
  void upload(const void* host, Tensor& dst) override;
  void download(const Tensor& src, void* host) override;
  void synchronize() override;

  void begin_step(const StepMetadata& meta) override;
  void copy_columns(const Tensor& src, Tensor& dst, int64_t col_begin) override;

  // CUDA graphs of decode steps on this backend's stream (CudaGraphRunner).
  std::unique_ptr<GraphStepRunner> make_graph_runner(std::function<void(int n_rows)> enqueue_step) override;
  uint64_t buffer_epoch() const override { return buffer_epoch_; }
  void set_decode_graph_bounds(int64_t max_rows, int64_t max_context) override;

  // Dense bf16 matmuls (no quantized kernels yet); attention of any window and
  // scale, head_dim 64/96/128/256, at most 16 Q heads per KV head, over a bf16
  // cache; sample_rows; no MoE ops yet.
  std::string unsupported(const OpArgs& args) const override;

  // Measured bytes per category (weights, kv_cache, workspace, runtime) and
  // what was asked for: DeviceMemoryAccounting::summary().
  std::string memory_summary() const;
  uint64_t measured_bytes(MemCategory category) const;

 protected:
  // The ops, after Backend's shape checks (kernels.h's kernels, cuBLASLt).
  void do_embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
                const StepMetadata& meta, Tensor& out) override;
  void do_matmul(const Tensor& x, const Linear& w, Tensor& y) override;
  void do_rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) override;
  void do_add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out) override;
  void do_add(Tensor& y, const Tensor& x) override;
  void do_scale(Tensor& x, float s) override;
  void do_softcap(Tensor& x, float cap) override;
  void do_rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) override;
  void do_silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void do_gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void do_kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k, const Tensor& v) override;
  void do_paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                          const AttentionHeads& heads, Tensor& out) override;
  void do_gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) override;
  // backend/cuda/sampling.h's sampler over logits already on this device.
  void do_sample_rows(const Tensor& logits, std::span<const DeviceSampleRow> rows, int32_t* ids,
                      float* logprobs) override;

 private:
  // A device buffer grown on demand (scratch between ops), counted as workspace.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };
  void* scratch(Scratch& s, size_t bytes);
  void free_scratch(Scratch& s);
  // Checks that the step metadata uploaded by begin_step is the one an op got.
  void check_step(const StepMetadata& meta, const char* op) const;
  DeviceSeqs device_seqs() const;

  int device_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<CudaAllocState> alloc_;
  std::unique_ptr<LtGemm> gemm_;
  // The step's packed metadata on the device (begin_step's one copy).
  Scratch meta_dev_;
  const StepMetadata* step_ = nullptr;
  int64_t step_n_tokens_ = 0, step_n_seqs_ = 0, step_n_logits_ = 0;
  int64_t step_max_context_ = 0, step_max_chunk_ = 0;
  bool step_all_decode_ = false;
  Scratch x_bf16_, out_bf16_, attn_ws_;
  Scratch sample_rows_, sample_work_, sample_out_;  // sample_rows: its rows, [n, vocab] work, ids/logprobs/top
  uint64_t buffer_epoch_ = 0;  // bumped whenever a scratch buffer moves
  int64_t graph_max_rows_ = 0, graph_max_context_ = 0;  // set_decode_graph_bounds (0: off)
  // reserve_weights' block: weight tensors share ownership of it.
  std::shared_ptr<void> weight_pool_;
  size_t weight_pool_bytes_ = 0, weight_pool_used_ = 0;
};

// make_backend's CUDA branch (backend.cpp calls it in a CUDA build).
std::shared_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// CUDA devices this process can see (0 when none or no driver).
int visible_device_count();
// cudaMemGetInfo of `device` (throws kInvalidArgument for a device that does not exist).
DeviceMemInfo device_memory_info(int device);

}  // namespace shardlm::backend::cuda
