#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#include <cmath>
#include <cstring>

namespace shardlm::backend {

std::string describe(const OpArgs& args) {
  switch (args.op) {
    case Op::kMatmul:
      if (args.scheme == WeightScheme::kDense) return str_cat("matmul of ", dtype_torch_name(args.weight_dtype), " weights");
      return str_cat("quantized ", weight_scheme_name(args.scheme),
                     args.scheme == WeightScheme::kFp8 ? std::string() : str_cat(" ", args.bits, "-bit"));
    case Op::kPagedAttention:
      return str_cat("paged_attention (head_dim ", args.head_dim,
                     args.heads.window > 0 ? str_cat(", sliding window ", args.heads.window) : std::string(),
                     args.heads.scale > 0.0f ? str_cat(", softmax scale ", args.heads.scale) : std::string(),
                     args.kv_dtype ? str_cat(", ", dtype_torch_name(*args.kv_dtype), " KV cache") : std::string(), ")");
    case Op::kSampleRows: return "sample_rows (sampling on the device)";
    case Op::kMoe: return "the mixture-of-experts ops (moe_route, moe_experts)";
    case Op::kKvGroups: return "a second KV pool for the sliding-window layers (KvLayerView::group)";
  }
  return op_name(args.op);
}

std::string Backend::unsupported(const OpArgs& args) const {
  switch (args.op) {
    case Op::kMatmul:
      return args.scheme == WeightScheme::kDense ? std::string()
                                                 : "no quantized kernels; run it on the cpu backend, or use the "
                                                   "unquantized checkpoint";
    case Op::kPagedAttention: return std::string();
    case Op::kSampleRows: return "no device sampler (its rows are sampled on the host)";
    case Op::kMoe: return "no mixture-of-experts kernels; run this MoE model on the CPU backend";
    case Op::kKvGroups:
      return "its attention reads one block table per sequence, so a hybrid model's sliding-window layers cannot keep "
             "their KV in a pool of their own; run this model on the CPU backend";
  }
  return "an unknown op";
}

void Backend::require(const OpArgs& args) const {
  const std::string why = unsupported(args);
  if (why.empty()) return;
  fail(ErrorCode::kUnsupported, describe(args), " is not supported on ", device().to_string(), " (backend ", name(),
       "): ", why);
}

// ---- the public ops: shapes checked once, for every device ----
namespace {
int64_t rows_of(const Tensor& t) { return t.rank() <= 1 ? 1 : t.numel() / t.dim(t.rank() - 1); }
int64_t cols_of(const Tensor& t) { return t.rank() == 0 ? 0 : t.dim(t.rank() - 1); }
}  // namespace

void Backend::embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
                    const StepMetadata& meta, Tensor& out) {
  const int64_t n = meta.n_tokens(), h = cols_of(table);
  SHARDLM_CHECK(table.rank() == 2 && table.dim(0) == vocab_end - vocab_begin && out.numel() == n * h,
                "embed: table ", table.describe(), ", vocab [", vocab_begin, ", ", vocab_end, "), out ", out.describe());
  for (int64_t t = 0; t < n; ++t) {  // the ids are on the host: checked before any device sees them
    const int64_t id = meta.token_ids()[t];
    if (id < 0 || id >= vocab_size)
      fail(ErrorCode::kInvalidArgument, "token id ", id, " at position ", t, " is outside the vocabulary [0, ",
           vocab_size, ")");
  }
  do_embed(table, vocab_begin, vocab_end, vocab_size, meta, out);
}

namespace {
// matmul's shape checks (matmul_many makes them for each of its outputs).
void check_matmul(const Tensor& x, const Linear& w, const Tensor& y) {
  const int64_t n = rows_of(x);
  if (w.quantized()) {
    SHARDLM_CHECK(cols_of(x) == w.quant.n_in && y.numel() == n * w.quant.n_out, "matmul: x ", x.describe(), ", ",
                  weight_scheme_name(w.quant.scheme), " weight [", w.quant.n_out, ", ", w.quant.n_in, "], y ",
                  y.describe());
  } else {
    SHARDLM_CHECK(w.weight.rank() == 2, "a weight matrix must be 2-D, got ", w.weight.describe());
    SHARDLM_CHECK(cols_of(x) == w.weight.dim(1) && y.numel() == n * w.weight.dim(0), "matmul: x ", x.describe(),
                  ", weight ", w.weight.describe(), ", y ", y.describe());
  }
  SHARDLM_CHECK(!w.bias.defined() || w.bias.numel() == w.out_features(), "matmul: bias ", w.bias.describe(), " for ",
                w.out_features(), " outputs");
}
}  // namespace

void Backend::matmul(const Tensor& x, const Linear& w, Tensor& y) {
  check_matmul(x, w, y);
  do_matmul(x, w, y);
}

void Backend::matmul_many(const Tensor& x, std::span<const MatmulOut> outs) {
  for (const MatmulOut& o : outs) {
    SHARDLM_CHECK(o.w && o.y, "matmul_many: an output without its weight or tensor");
    check_matmul(x, *o.w, *o.y);
  }
  do_matmul_many(x, outs);
}

void Backend::do_matmul_many(const Tensor& x, std::span<const MatmulOut> outs) {
  for (const MatmulOut& o : outs) do_matmul(x, *o.w, *o.y);
}

void Backend::rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) {
  SHARDLM_CHECK(cols_of(x) == weight.weight.numel() && out.numel() == x.numel(), "rms_norm: x ", x.describe(),
                ", weight ", weight.weight.describe(), ", out ", out.describe());
  do_rms_norm(x, weight, eps, out);
}

void Backend::add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out) {
  SHARDLM_CHECK(hidden.numel() == delta.numel() && out.numel() == hidden.numel() &&
                    cols_of(hidden) == weight.weight.numel(),
                "add_rms_norm: hidden ", hidden.describe(), ", delta ", delta.describe(), ", weight ",
                weight.weight.describe(), ", out ", out.describe());
  do_add_rms_norm(hidden, delta, weight, eps, out);
}

void Backend::add(Tensor& y, const Tensor& x) {
  SHARDLM_CHECK(y.numel() == x.numel(), "add: y ", y.describe(), ", x ", x.describe());
  do_add(y, x);
}

void Backend::scale(Tensor& x, float s) { do_scale(x, s); }

void Backend::rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) {
  const int64_t half = inv_freq.rank() == 2 ? inv_freq.dim(1) : inv_freq.numel();
  SHARDLM_CHECK(x.rank() == 3 && x.dim(0) == meta.n_tokens() && half > 0 && half * 2 <= x.dim(2) &&
                    (inv_freq.rank() == 1 || (inv_freq.rank() == 2 && inv_freq.dim(0) == 2)),
                "rope: x ", x.describe(), ", inv_freq ", inv_freq.describe(), ", ", meta.n_tokens(), " tokens");
  do_rope(x, inv_freq, meta, mscale);
}

void Backend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  SHARDLM_CHECK(gate.numel() == up.numel() && out.numel() == gate.numel(), "silu_mul: gate ", gate.describe(),
                ", up ", up.describe(), ", out ", out.describe());
  do_silu_mul(gate, up, out);
}

void Backend::gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  SHARDLM_CHECK(gate.numel() == up.numel() && out.numel() == gate.numel(), "gelu_tanh_mul: gate ", gate.describe(),
                ", up ", up.describe(), ", out ", out.describe());
  do_gelu_tanh_mul(gate, up, out);
}

void Backend::kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k, const Tensor& v) {
  const int64_t row = cache.n_kv_heads * cache.head_dim;
  SHARDLM_CHECK(k.numel() == meta.n_tokens() * row && v.numel() == k.numel(), "kv_cache_write: k ", k.describe(),
                ", v ", v.describe());
  do_kv_cache_write(cache, meta, k, v);
}

void Backend::paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                              const AttentionHeads& heads, Tensor& out) {
  const int64_t elems = meta.n_tokens() * heads.n_q_heads * cache.head_dim;
  SHARDLM_CHECK(q.numel() == elems && out.numel() == elems, "paged_attention: q ", q.describe(), ", out ",
                out.describe());
  do_paged_attention(q, cache, meta, heads, out);
}

void Backend::gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) {
  SHARDLM_CHECK(rows_of(x) == meta.n_tokens() && out.numel() == meta.n_logits() * cols_of(x), "gather_logit_rows: x ",
                x.describe(), ", out ", out.describe());
  do_gather_logit_rows(x, meta, out);
}

void Backend::sample_rows(const Tensor& logits, std::span<const DeviceSampleRow> rows, int32_t* ids,
                          float* logprobs) {
  const int64_t n = static_cast<int64_t>(rows.size());
  SHARDLM_CHECK(logits.rank() == 2 && logits.dim(0) == n, "sample_rows: logits ", logits.describe(), " for ", n,
                " rows");
  do_sample_rows(logits, rows, ids, logprobs);
}

void Backend::moe_route(const Tensor& logits, int64_t top_k, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t n = rows_of(logits);
  SHARDLM_CHECK(ids.dtype() == DType::kI32 && ids.numel() == n * top_k && weights.numel() == n * top_k,
                "moe_route: logits ", logits.describe(), ", ids ", ids.describe(), ", weights ", weights.describe());
  do_moe_route(logits, top_k, renormalize, ids, weights);
}

void Backend::moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertLinears* experts,
                          int64_t n_experts_local, int64_t expert_begin, Tensor& out) {
  const int64_t n = rows_of(x), top_k = n > 0 ? ids.numel() / n : 0;
  SHARDLM_CHECK(ids.dtype() == DType::kI32 && ids.numel() == n * top_k && weights.numel() == ids.numel() &&
                    out.numel() == x.numel(),
                "moe_experts: x ", x.describe(), ", ids ", ids.describe(), ", weights ", weights.describe(), ", out ",
                out.describe());
  do_moe_experts(x, ids, weights, experts, n_experts_local, expert_begin, out);
}

void Backend::do_sample_rows(const Tensor&, std::span<const DeviceSampleRow>, int32_t*, float*) {
  fail(ErrorCode::kUnsupported, "sampling on the device is not supported on ", name(),
       "; its rows are sampled on the host");
}

void Backend::do_moe_route(const Tensor&, int64_t, bool, Tensor&, Tensor&) {
  fail(ErrorCode::kUnsupported, "moe_route (mixture-of-experts routing) is not supported on ", name(),
       "; run this MoE model on the CPU backend");
}

void Backend::do_moe_experts(const Tensor&, const Tensor&, const Tensor&, const ExpertLinears*, int64_t, int64_t,
                             Tensor&) {
  fail(ErrorCode::kUnsupported, "moe_experts (mixture-of-experts expert MLPs) is not supported on ", name(),
       "; run this MoE model on the CPU backend");
}

#if defined(SHARDLM_HAVE_CUDA)
namespace cuda {
// backend/cuda/cuda_backend.cpp
std::shared_ptr<Backend> make_cuda_backend(const BackendOptions& options);
int visible_device_count();
DeviceMemInfo device_memory_info(int device);
}  // namespace cuda
#endif

void Backend::copy_columns(const Tensor& src, Tensor& dst, int64_t col_begin) {
  const int64_t rows = src.rank() == 2 ? src.dim(0) : 0, w = src.rank() == 2 ? src.dim(1) : 0;
  SHARDLM_CHECK(src.rank() == 2 && dst.rank() == 2 && dst.dim(0) == rows && col_begin >= 0 &&
                    col_begin + w <= dst.dim(1) && src.dtype() == dst.dtype(),
                "copy_columns: src ", src.describe(), " into dst ", dst.describe(), " at column ", col_begin);
  SHARDLM_CHECK(src.device().is_cpu() && dst.device().is_cpu(), "copy_columns: the base implementation copies host "
                "memory, got ", src.describe(), " and ", dst.describe());
  const size_t e = dtype_size(src.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst.data()) + static_cast<size_t>(r * dst.dim(1) + col_begin) * e,
                static_cast<const char*>(src.data()) + static_cast<size_t>(r * w) * e, static_cast<size_t>(w) * e);
}

void Backend::softcap(Tensor& x, float cap) {
  SHARDLM_CHECK(cap > 0.0f, "softcap: the cap must be positive, got ", cap, " for ", x.describe());
  do_softcap(x, cap);
}

void Backend::do_softcap(Tensor& x, float cap) {
  SHARDLM_CHECK(x.dtype() == DType::kF32 && x.device().is_cpu(),
                "softcap: the base implementation takes host f32, got ", x.describe());
  float* p = static_cast<float*>(x.data());
  const float inv = 1.0f / cap;
  for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] = cap * std::tanh(p[i] * inv);
}

void require_device_support(const Device& device) {
#if !defined(SHARDLM_HAVE_CUDA)
  if (!device.is_cpu())
    fail(ErrorCode::kUnsupported, "device ", device.to_string(),
         ": this shardlm was built without CUDA; rebuild with -DSHARDLM_CUDA=ON (needs the CUDA toolkit)");
#endif
}

namespace {

std::shared_ptr<Backend> make_device_backend(const BackendOptions& options) {
  if (options.device.is_cpu()) return std::make_shared<CpuBackend>(options.n_threads);
  require_device_support(options.device);
#if defined(SHARDLM_HAVE_CUDA)
  return cuda::make_cuda_backend(options);
#else
  fail(ErrorCode::kInternal, "unreachable: ", options.device.to_string());
#endif
}

}  // namespace

std::shared_ptr<Backend> make_backend(const BackendOptions& options) {
  std::shared_ptr<Backend> b = make_device_backend(options);
  if (!b->set_batch_invariant(options.batch_invariant))
    fail(ErrorCode::kUnsupported, "--batch-invariant: the ", options.device.to_string(),
         " backend has no batch-invariant kernels; run without --batch-invariant, or on --device cpu");
  return b;
}

int cuda_device_count() {
#if defined(SHARDLM_HAVE_CUDA)
  return cuda::visible_device_count();
#else
  return 0;
#endif
}

DeviceMemInfo cuda_device_memory(int device) {
  require_device_support(Device{DeviceKind::kCuda, device});
#if defined(SHARDLM_HAVE_CUDA)
  return cuda::device_memory_info(device);
#else
  fail(ErrorCode::kUnsupported, "cuda:", device,
       ": this shardlm was built without CUDA; rebuild with -DSHARDLM_CUDA=ON (needs the CUDA toolkit)");
#endif
}

}  // namespace shardlm::backend
