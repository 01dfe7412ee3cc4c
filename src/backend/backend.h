// The compute interface every device implements. One Backend object per rank
// owns the rank's device, its allocator and its execution context (a CPU
// thread budget; a CUDA stream). Model code is written once against it, the
// way it is written against Communicator: it never touches a device pointer,
// never allocates per step and never knows which device it runs on.
//
// Ops take Tensors. Activations are in activation_dtype() (f32 on CPU; a GPU
// backend may choose bf16); weights stay in their checkpoint dtype and are
// widened in registers. Shapes are written [rows, cols] below; each public op
// checks them once, here in the base class (backend.cpp), throwing
// Error(kInternal) on a mismatch (a bug in the caller, never user input), and
// then calls its device's do_<op>, which checks only what is its own (dtypes,
// where the tensor lives). Ops run in order on the backend's context; a device backend may
// run them asynchronously, and download()/synchronize() wait.
//
// Implementations: backend/cpu (CpuBackend), backend/cuda (with SHARDLM_CUDA).
// The scalar reference kernels (backend/cpu/ops.h, namespace ref) are the oracle
// every implementation is tested against.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cpu/quant_ops.h"
#include "backend/device/graph_buckets.h"
#include "backend/device/memory_accounting.h"
#include "backend/op_args.h"
#include "backend/step_metadata.h"
#include "core/tensor.h"

namespace shardlm::backend {

// A linear layer's weights as a rank holds them: weight [out, in] in its
// stored dtype (unquantized: f32/f16/bf16; fp8: F8_E4M3), bias [out] or
// undefined, and for a quantized layer its scheme and the other stored parts
// (backend/cpu/quant_ops.h: QuantizedWeight). The parts stay in the checkpoint's
// dtypes and layout; kernels dequantize in registers. For AWQ/GPTQ `weight`
// is undefined (the packed words are quant.qweight).
struct Linear {
  Tensor weight;
  Tensor bias;
  QuantizedWeight quant;
  bool quantized() const { return quant.scheme != WeightScheme::kDense; }
  int64_t out_features() const { return quantized() ? quant.n_out : weight.dim(0); }
};

// One product of Backend::matmul_many: y[n, w->out_features()] = x × w->weightᵀ
// (+ w->bias). Both point at the caller's objects for the call's duration.
struct MatmulOut {
  const Linear* w = nullptr;
  Tensor* y = nullptr;
};

// A norm's weight as the op applies it: offset + weight[i] (Gemma's norms
// store w for the factor 1 + w; every other family's offset is 0). A Tensor
// converts to one with offset 0.
struct NormWeight {
  NormWeight(const Tensor& w, float offset_ = 0.0f) : weight(w), offset(offset_) {}  // NOLINT: implicit on purpose
  Tensor weight;
  float offset = 0.0f;
};

// One expert of a MoE layer as a rank holds it (checkpoint dtype): gate, up
// [inter_local, hidden], down [hidden, inter_local].
struct ExpertLinears {
  Tensor gate, up, down;
};

// One row's sampling as a device sampler runs it (backend/cuda/sampling.h has
// the semantics: temperature, greedy below sampling's kGreedyTemperature,
// min-p, top-k, top-p, a Philox draw seeded with (seed, step)). Penalties are
// not passed yet: rows with penalties are sampled on the host
// (sampling/device_sampling.h).
struct DeviceSampleRow {
  float temperature = 1.0f;
  int32_t top_k = -1;  // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;   // tokens this sequence has drawn so far
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu (2 threads, avx2)", "cuda:0 (NVIDIA H200)"
  virtual DType activation_dtype() const = 0;

  // ---- memory ----
  // A zero-filled tensor on the device. Every allocation is counted, as it
  // is made, by allocated_bytes() (and uncounted when the last Tensor sharing
  // its storage goes): a measurement of what the rank holds, never a formula.
  virtual Tensor alloc(DType dtype, TensorShape shape) = 0;
  virtual int64_t allocated_bytes() const = 0;
  // A weight as the device holds it, from its host form: a view of the
  // checkpoint mapping, or a host buffer (a column slice) it now owns. CPU
  // keeps views as they are (zero copy, nothing allocated) and counts owned
  // buffers as allocated; a GPU copies to device memory.
  virtual Tensor adopt_weight(Tensor host) = 0;
  // A hint before a model's weights are adopted: n_tensors tensors of
  // `bytes` in all come next. A device backend may obtain them in one
  // allocation (so what it measures is the weights, not one allocator
  // rounding per tensor); the CPU keeps checkpoint views and ignores it.
  virtual void reserve_weights(int64_t /*bytes*/, int64_t /*n_tensors*/) {}
  // Host <-> device copies of a whole tensor's bytes.
  virtual void upload(const void* host, Tensor& dst) = 0;
  virtual void download(const Tensor& src, void* host) = 0;
  virtual void synchronize() = 0;

  // ---- one step ----
  // Called once per step before its ops, with the step's packed metadata
  // (a device backend copies meta.packed() here, in one transfer).
  virtual void begin_step(const StepMetadata& meta) = 0;

  // out[n_tokens, hidden]: rows of table [vocab_local, hidden] for the step's
  // token ids in [vocab_begin, vocab_end), zeros elsewhere (summed over the TP
  // group by the caller). Throws kInvalidArgument for an id outside
  // [0, vocab_size).
  void embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size, const StepMetadata& meta,
             Tensor& out);
  // ---- what this backend can run ----
  // The one capability query (backend/op_args.h: Op, OpArgs): whether `op`
  // runs here with these arguments. The model asks at load, for each kind of
  // weight, layer and feature it has; a test skips what a device says it lacks.
  bool supports(const OpArgs& args) const { return unsupported(args).empty(); }
  // Why not: "" when supports(args), else what this backend cannot do ("a
  // float32 KV cache", "head_dim 80 (64, 96, 128 or 256)").
  virtual std::string unsupported(const OpArgs& args) const;
  // Throws Error(kUnsupported) "<describe(args)> is not supported on <name()>:
  // <unsupported(args)>" unless supports(args).
  void require(const OpArgs& args) const;

  // y[n, out] = x[n, in] × weightᵀ (+ bias). A quantized Linear reaches a
  // backend only when supports(OpArgs::quant_matmul(scheme, bits)) said yes at load.
  void matmul(const Tensor& x, const Linear& w, Tensor& y);
  // matmul(x, *o.w, *o.y) for each o of outs, the products that read the
  // same x (q, k, v; gate, up), each y exactly what its own matmul gives.
  // A backend may run them as one launch (the CPU: one parallel region over
  // every matrix's row blocks where they are dense); the base runs them one
  // by one. The ys must not overlap x or each other.
  void matmul_many(const Tensor& x, std::span<const MatmulOut> outs);
  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) × (weight.offset + weight.weight);
  // x, out: [rows, d] (out may be x).
  void rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out);
  // hidden += delta, then out = rms_norm(hidden): the residual add fused with
  // the norm that follows it. hidden, delta, out: [rows, d].
  void add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out);
  // y += x, both [rows, d].
  void add(Tensor& y, const Tensor& x);
  // x *= s, in place (Gemma's embedding scale).
  void scale(Tensor& x, float s);
  // x = cap × tanh(x / cap), in place: Gemma's final_logit_softcapping over
  // logits [rows, vocab] f32. The base do_softcap works on host memory.
  void softcap(Tensor& x, float cap);
  // Rotate-half rotary embedding in place at the step's positions, over the
  // first 2 × inv_freq.numel() dims of each head (all of them, or Phi's
  // partial_rotary_factor of them; the rest pass through), cos and sin times
  // mscale (LongRoPE's attention factor, else 1).
  // x: [n_tokens, n_heads, head_dim]; inv_freq: [rotary_dim / 2] f32 (host or
  // device), or [2, rotary_dim / 2] for LongRoPE: row 0 the short factors', row
  // 1 the long ones', taken by the tokens meta.long_rope() marks.
  void rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale);
  // out[n, inter] = silu(gate) × up; gate, up: [n, inter] (out may be gate).
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out);
  // out[n, inter] = gelu_tanh(gate) × up (GeGLU: Gemma); shapes as silu_mul.
  void gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out);
  // Stores the step's keys and values, k, v: [n_tokens, n_kv_local, head_dim], into the cache.
  void kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k, const Tensor& v);
  // Causal attention of each chunk over its cached past and itself (written
  // first with kv_cache_write), scaled by heads.scale_for(head_dim), over the
  // last heads.window keys when the layer has a sliding window.
  // q, out: [n_tokens, n_q_local, head_dim].
  // A layer's heads reach it only when supports(OpArgs::attention(...)) said yes at load.
  void paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta, const AttentionHeads& heads,
                       Tensor& out);
  // out[n_logits, d] = rows meta.logit_rows() of x[n_tokens, d].
  void gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out);
  // dst[r, col_begin + j] = src[r, j] for every row r and column j of src:
  // a rank's vocab slice of the logits placed into full rows after an
  // all_gather. src: [rows, w], dst: [rows, d] with col_begin + w <= d, same
  // dtype. The base implementation copies host memory (CPU backends).
  virtual void copy_columns(const Tensor& src, Tensor& dst, int64_t col_begin);

  // ---- decode-step graphs (backend/device/decode_graphs.h) ----
  // A runner that captures what enqueue_step(n_rows) enqueues on this
  // backend's context into a graph per bucket and replays it, or nullptr
  // when the backend has none (the CPU: its ops run as they are called).
  virtual std::unique_ptr<GraphStepRunner> make_graph_runner(std::function<void(int n_rows)> enqueue_step) {
    (void)enqueue_step;
    return nullptr;
  }
  // Changes whenever a buffer the backend's ops use internally moved (a
  // scratch regrown): a graph recorded before then is stale.
  virtual uint64_t buffer_epoch() const { return 0; }
  // > 0: every all-decode step sizes its attention for contexts up to
  // max_context and for at least max_rows sequences (its split-K partition
  // count and workspace), whatever its own longest context, so one graph
  // serves every step of a bucket. 0: each step sizes its own (eager).
  virtual void set_decode_graph_bounds(int64_t max_rows, int64_t max_context) {
    (void)max_rows;
    (void)max_context;
  }

  // ---- batch invariance ----
  // on: from now on, every op computes each output row in an order that does
  // not depend on the other rows of its step (how many share it, their
  // contexts, which kernel the row count selects), so a row's result is
  // bit-identical computed alone or in any batch: what speculative
  // verification and same-tokens-under-load need. off: the fastest kernel
  // per shape (the default). Returns whether the backend now runs as asked;
  // one without invariant kernels answers false to on, and the caller must
  // refuse the feature that needed it. The CPU backend's setting is
  // process-wide (every rank of a process shares it).
  virtual bool set_batch_invariant(bool on) { return !on; }
  virtual bool batch_invariant() const { return false; }

  // ---- sampling where the logits are (supports(OpArgs::of(Op::kSampleRows))) ----
  // ids[r], logprobs[r] (host memory): row r of logits [n_rows, vocab] f32 on
  // this device sampled as rows[r] says; logprobs are the chosen tokens' raw
  // log_softmax. Only the ids and logprobs cross. Base: Error(kUnsupported).
  void sample_rows(const Tensor& logits, std::span<const DeviceSampleRow> rows, int32_t* ids, float* logprobs);

  // ---- mixture of experts (backend/cpu/moe_ops.h has the contracts) ----
  // Implemented where supports(OpArgs::of(Op::kMoe)) (a MoE model checks at load).
  // ids[n, top_k] (i32), weights[n, top_k] (f32): each token's top_k experts by
  // router logit, logits: [n, n_experts]; softmax probabilities, renormalised
  // over the chosen when `renormalize`. The base class throws
  // Error(kUnsupported) naming the device: a backend without it cannot run MoE.
  void moe_route(const Tensor& logits, int64_t top_k, bool renormalize, Tensor& ids, Tensor& weights);
  // out[n, hidden] = Σ over each token's routed experts that this rank holds
  // (global ids [expert_begin, expert_begin + experts.size())) of
  // weight × down(silu(gate(x)) × up(x)); tokens grouped by expert, each
  // active expert's matrices applied once to its rows. x: [n, hidden].
  // Base class: Error(kUnsupported) naming the device.
  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertLinears* experts,
                   int64_t n_experts_local, int64_t expert_begin, Tensor& out);

 protected:
  // What each device implements, called by the public op after its shape
  // checks. sample_rows, moe_route and moe_experts have a base that throws
  // Error(kUnsupported) naming the device (backends whose supports(OpArgs)
  // says no keep it).
  virtual void do_embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
                        const StepMetadata& meta, Tensor& out) = 0;
  virtual void do_matmul(const Tensor& x, const Linear& w, Tensor& y) = 0;
  virtual void do_matmul_many(const Tensor& x, std::span<const MatmulOut> outs);  // base: do_matmul per out
  virtual void do_rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) = 0;
  virtual void do_add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps,
                               Tensor& out) = 0;
  virtual void do_add(Tensor& y, const Tensor& x) = 0;
  virtual void do_scale(Tensor& x, float s) = 0;
  virtual void do_softcap(Tensor& x, float cap);  // base: host memory (the CPU backend keeps it)
  virtual void do_rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) = 0;
  virtual void do_silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void do_gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) = 0;
  virtual void do_kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k,
                                 const Tensor& v) = 0;
  virtual void do_paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                                  const AttentionHeads& heads, Tensor& out) = 0;
  virtual void do_gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) = 0;
  virtual void do_sample_rows(const Tensor& logits, std::span<const DeviceSampleRow> rows, int32_t* ids,
                              float* logprobs);
  virtual void do_moe_route(const Tensor& logits, int64_t top_k, bool renormalize, Tensor& ids, Tensor& weights);
  virtual void do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertLinears* experts,
                              int64_t n_experts_local, int64_t expert_begin, Tensor& out);
};

// What supports(args) was asked, for messages: "quantized awq 4-bit",
// "paged_attention (head_dim 256, sliding window 1024, softmax scale 0.0625)".
std::string describe(const OpArgs& args);

struct BackendOptions {
  Device device;            // cpu, or cuda:i
  int n_threads = 0;        // CPU: threads for this rank's ops (0: all cores / ranks sharing them)
  bool batch_invariant = false;  // --batch-invariant: set_batch_invariant(true), refused where unsupported
};

// Throws make_backend's Error(kUnsupported) for a cuda device in a build
// without CUDA (naming -DSHARDLM_CUDA=ON); does nothing otherwise.
void require_device_support(const Device& device);

// CUDA devices this process sees: 0 in a build without CUDA or without a driver.
int cuda_device_count();
// A CUDA device's free and total memory now (cudaMemGetInfo). Throws
// Error(kUnsupported) for cpu, or in a build without CUDA.
DeviceMemInfo cuda_device_memory(int device);

// The backend for options.device. Throws Error(kUnsupported) for a device
// this build cannot drive (cuda without SHARDLM_CUDA), naming the build flag,
// and for options.batch_invariant on a backend without invariant kernels,
// naming --batch-invariant. The setting is applied either way (on or off).
std::shared_ptr<Backend> make_backend(const BackendOptions& options);

}  // namespace shardlm::backend
