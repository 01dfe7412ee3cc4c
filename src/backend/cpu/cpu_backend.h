// The CPU implementation of Backend: f32 activations, weights widened in
// registers (backend/cpu/ops.h kernels: AVX2/FMA + OpenMP), host memory counted
// as the allocator obtains it.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/moe_ops.h"

namespace shardlm::backend {

class CpuBackend final : public Backend {
 public:
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
  // Everything but sample_rows: dense f32/f16/bf16 weights; AWQ 4-bit, GPTQ
  // 4/8-bit and FP8 E4M3 (backend/cpu/quant_ops.h); attention of any window,
  // scale and head size over an f32/f16/bf16/fp8 cache; the MoE ops.
  std::string unsupported(const OpArgs& args) const override;
  // Dense matmuls on backend/cpu/rows_gemm.h for every row count, quantized ones
  // on their row-order kernels, attention split by context length only.
  bool set_batch_invariant(bool on) override;
  bool batch_invariant() const override;

 protected:
  // The ops, after Backend's shape checks (backend/cpu/ops.h's kernels).
  void do_embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
                const StepMetadata& meta, Tensor& out) override;
  void do_matmul(const Tensor& x, const Linear& w, Tensor& y) override;
  // Dense outputs in one backend::matmul_many (one parallel region where they
  // take the rows kernel); any quantized one: one matmul per output.
  void do_matmul_many(const Tensor& x, std::span<const MatmulOut> outs) override;
  void do_rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) override;
  void do_add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out) override;
  void do_add(Tensor& y, const Tensor& x) override;
  void do_scale(Tensor& x, float s) override;
  void do_rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) override;
  void do_silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void do_gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void do_kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k, const Tensor& v) override;
  void do_paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                          const AttentionHeads& heads, Tensor& out) override;
  void do_gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) override;
  void do_moe_route(const Tensor& logits, int64_t top_k, bool renormalize, Tensor& ids, Tensor& weights) override;
  void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertLinears* experts,
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
