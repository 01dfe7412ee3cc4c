// The CPU implementation of Backend: f32 activations, weights widened in
// registers (backend/ops.h kernels: AVX2/FMA + OpenMP), host memory counted
// as the allocator obtains it.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/moe_ops.h"

namespace shardlm::backend {

class CpuBackend final : public Backend {
 public:
  bool supports_kv_groups() const override { return true; }
  // n_threads: OpenMP threads of this rank's ops (0: all cores).
  explicit CpuBackend(int n_threads = 0);

  Device device() const override { return Device{}; }
  std::string name() const override;
  DType activation_dtype() const override { return DType::kF32; }
  int n_threads() const { return n_threads_; }

  Tensor alloc(DType dtype, TensorShape shape) override;
  int64_t allocated_bytes() const override { return counter_->bytes.load(); }
  Tensor adopt_weight(Tensor host) override;
  void upload(const void* host, Tensor& dst) override;
  void download(const Tensor& src, void* host) override;
  void synchronize() override {}

  void begin_step(const StepMetadata& meta) override;
  void embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
             const StepMetadata& meta, Tensor& out) override;
  void matmul(const Tensor& x, const Linear& w, Tensor& y) override;
  // AWQ 4-bit, GPTQ 4/8-bit and FP8 E4M3 (backend/quant_ops.h).
  bool supports(WeightScheme scheme, int bits) const override;
  void rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out) override;
  void add(Tensor& y, const Tensor& x) override;
  void scale(Tensor& x, float s) override;
  void rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k, const Tensor& v) override;
  void paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                       const AttentionHeads& heads, Tensor& out) override;
  void gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) override;
  bool has_moe_ops() const override { return true; }
  // Dense matmuls on backend/rows_gemm.h for every row count, quantized ones
  // on their row-order kernels, attention split by context length only.
  bool set_batch_invariant(bool on) override;
  bool batch_invariant() const override;
  void moe_route(const Tensor& logits, int64_t top_k, bool renormalize, Tensor& ids, Tensor& weights) override;
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertLinears* experts,
                   int64_t n_experts_local, int64_t expert_begin, Tensor& out) override;

 private:
  // Shared with the storage deleters, so a tensor may outlive its backend.
  struct Counter {
    std::atomic<int64_t> bytes{0};
  };
  std::shared_ptr<Counter> counter_ = std::make_shared<Counter>();
  int n_threads_;
  MoeScratch moe_scratch_;                 // grouped-expert buffers, grown, reused
  std::vector<ExpertMatrices> moe_views_;  // [n_experts_local] of the current call
};

}  // namespace shardlm::backend
