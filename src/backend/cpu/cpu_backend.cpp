#include "backend/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "core/cpu_isa.h"
#include "backend/cpu/rows_gemm.h"
#include "core/error.h"

namespace shardlm::backend {

namespace {

constexpr size_t kAlignment = 64;              // a cache line; every SIMD load width
constexpr size_t kMapThreshold = size_t{1} << 20;  // from here on, whole pages from mmap
constexpr size_t kPage = 4096;

const float* f32(const Tensor& t, const char* what) {
  SHARDLM_CHECK(t.dtype() == DType::kF32 && t.device().is_cpu(), what, ": expected f32 on cpu, got ",
                t.describe());
  return static_cast<const float*>(t.data());
}
float* f32_mut(Tensor& t, const char* what) { return const_cast<float*>(f32(t, what)); }

int64_t rows_of(const Tensor& t) { return t.rank() <= 1 ? 1 : t.numel() / t.dim(t.rank() - 1); }
int64_t cols_of(const Tensor& t) { return t.rank() == 0 ? 0 : t.dim(t.rank() - 1); }

MatrixView matrix(const Tensor& w) {
  SHARDLM_CHECK(w.rank() == 2, "a weight matrix must be 2-D, got ", w.describe());
  return {w.data(), w.dtype(), w.dim(0), w.dim(1)};
}
VectorView vector(const Tensor& v) { return {v.data(), v.dtype(), v.numel()}; }

}  // namespace

CpuBackend::CpuBackend(int n_threads) : n_threads_(n_threads) { set_num_threads(n_threads_); }

bool CpuBackend::set_batch_invariant(bool on) {
  backend::set_batch_invariant(on);
  return true;
}

bool CpuBackend::batch_invariant() const { return backend::batch_invariant(); }

std::string CpuBackend::name() const {
  // The GEMV/small-batch kernel's ISA, chosen by CPUID at run time.
  const std::string isa = cpu_isa_name(active_cpu_isa());
  const bool bf16 = default_dense_activations() == DenseActivations::kBf16;
  return "cpu (" + std::to_string(n_threads_ > 0 ? n_threads_ : num_threads()) + " threads, " + isa +
         (bf16 ? ", bf16 activations" : "") + ")";
}

Tensor CpuBackend::alloc(DType dtype, TensorShape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  void* p = nullptr;
  size_t obtained = 0;
  std::function<void(void*)> release;
  if (bytes >= kMapThreshold) {
    // Large buffers (the KV cache, big workspaces): anonymous pages, zero
    // until first touched (resident memory grows with use), in huge pages
    // where the kernel allows, so attention and GEMM walk fewer TLB entries.
    obtained = (bytes + kPage - 1) / kPage * kPage;
    p = mmap(nullptr, obtained, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) p = nullptr;
    if (p) madvise(p, obtained, MADV_HUGEPAGE);
    release = [obtained](void* q) { munmap(q, obtained); };
  } else {
    obtained = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    p = std::aligned_alloc(kAlignment, obtained);
    if (p) std::memset(p, 0, obtained);
    release = [](void* q) { std::free(q); };
  }
  if (!p)
    fail(ErrorCode::kOutOfMemory, "could not allocate ", bytes, " bytes of host memory for a ",
         dtype_safetensors_name(dtype), shape.to_string(), " tensor");
  // Counted: the bytes each allocation asked for, as it happens (a second
  // copy of a weight, or a cache sized twice, shows here). Alignment and page
  // rounding (under 4 KiB per allocation) is left out, so that the figure can
  // be compared exactly with plan's.
  const int64_t counted = static_cast<int64_t>(bytes);
  counter_->bytes += counted;
  std::shared_ptr<void> storage(p, [counter = counter_, counted, release = std::move(release)](void* q) {
    release(q);
    counter->bytes -= counted;
  });
  return Tensor::owning(std::move(storage), p, dtype, shape);
}

Tensor CpuBackend::adopt_weight(Tensor host) {
  SHARDLM_CHECK(host.device().is_cpu(), "adopt_weight takes a host tensor, got ", host.describe());
  if (!host.owns_storage()) return host;  // a view of the checkpoint mapping
  Tensor owned = alloc(host.dtype(), host.shape());
  std::memcpy(owned.data(), host.data(), host.nbytes());
  return owned;
}

void CpuBackend::upload(const void* host, Tensor& dst) { std::memcpy(dst.data(), host, dst.nbytes()); }
void CpuBackend::download(const Tensor& src, void* host) { std::memcpy(host, src.data(), src.nbytes()); }

void CpuBackend::begin_step(const StepMetadata&) { set_num_threads(n_threads_); }

void CpuBackend::do_embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
                       const StepMetadata& meta, Tensor& out) {
  const int64_t n = meta.n_tokens(), h = cols_of(table);
  (void)vocab_size;  // every id was checked against it by Backend::embed
  float* o = f32_mut(out, "embed out");
  const int32_t* ids = meta.token_ids();
  const size_t esize = dtype_size(table.dtype());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = ids[t];
    float* row = o + t * h;
    if (id < vocab_begin || id >= vocab_end) {
      std::memset(row, 0, static_cast<size_t>(h) * sizeof(float));
      continue;
    }
    const void* src = static_cast<const char*>(table.data()) + static_cast<size_t>((id - vocab_begin) * h) * esize;
    for (int64_t i = 0; i < h; ++i) row[i] = load_as_f32(src, table.dtype(), static_cast<size_t>(i));
  }
}

std::string CpuBackend::unsupported(const OpArgs& args) const {
  switch (args.op) {
    case Op::kMatmul:
      switch (args.scheme) {
        case WeightScheme::kDense:
          return rows_gemm_supports(args.weight_dtype)
                     ? std::string()
                     : str_cat("weights stored as ", dtype_torch_name(args.weight_dtype), " (f32, f16 or bf16)");
        case WeightScheme::kAwq: return args.bits == 4 ? std::string() : str_cat(args.bits, "-bit AWQ (4-bit only)");
        case WeightScheme::kGptq:
          return args.bits == 4 || args.bits == 8 ? std::string() : str_cat(args.bits, "-bit GPTQ (4 or 8 bits)");
        case WeightScheme::kFp8: return std::string();
      }
      break;
    case Op::kPagedAttention:
      if (args.kv_dtype && *args.kv_dtype != DType::kF32 && *args.kv_dtype != DType::kF16 &&
          *args.kv_dtype != DType::kBF16 && *args.kv_dtype != DType::kF8E4M3)
        return str_cat("a KV cache of ", dtype_torch_name(*args.kv_dtype), " (f32, f16, bf16 or fp8)");
      return std::string();
    case Op::kMoe: return std::string();
    case Op::kKvGroups: return std::string();
    case Op::kSampleRows: break;
  }
  return Backend::unsupported(args);
}

void CpuBackend::do_matmul(const Tensor& x, const Linear& w, Tensor& y) {
  if (w.quantized()) {
    const QuantMatrixView q = quant_view(w.quant, w.weight);
    const int64_t n = rows_of(x);
    const VectorView b = w.bias.defined() ? vector(w.bias) : VectorView{};
    quant_matmul(f32(x, "matmul x"), n, q, w.bias.defined() ? &b : nullptr, f32_mut(y, "matmul y"));
    return;
  }
  const MatrixView m = matrix(w.weight);
  const int64_t n = rows_of(x);
  const VectorView b = w.bias.defined() ? vector(w.bias) : VectorView{};
  backend::matmul(f32(x, "matmul x"), n, m, w.bias.defined() ? &b : nullptr, f32_mut(y, "matmul y"));
}

void CpuBackend::do_matmul_many(const Tensor& x, std::span<const MatmulOut> outs) {
  const int64_t n_parts = static_cast<int64_t>(outs.size());
  // The most one rows_gemm_many takes (rows_gemm.h); more go one matmul each.
  bool dense = n_parts <= kRowsGemmMaxParts;
  for (const MatmulOut& o : outs) dense = dense && !o.w->quantized();
  if (!dense) return Backend::do_matmul_many(x, outs);
  MatmulPart parts[kRowsGemmMaxParts];
  VectorView biases[kRowsGemmMaxParts];
  for (int64_t p = 0; p < n_parts; ++p) {
    const Linear& w = *outs[p].w;
    if (w.bias.defined()) biases[p] = vector(w.bias);
    parts[p] = {matrix(w.weight), w.bias.defined() ? &biases[p] : nullptr, f32_mut(*outs[p].y, "matmul y")};
  }
  backend::matmul_many(f32(x, "matmul x"), rows_of(x), parts, n_parts);
}

void CpuBackend::do_rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) {
  const Tensor& w = weight.weight;
  backend::rms_norm(f32(x, "rms_norm x"), rows_of(x), vector(w), eps, f32_mut(out, "rms_norm out"), weight.offset);
}

void CpuBackend::do_add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out) {
  add(hidden, delta);
  rms_norm(hidden, weight, eps, out);
}

void CpuBackend::do_add(Tensor& y, const Tensor& x) {
  add_inplace(f32_mut(y, "add y"), f32(x, "add x"), y.numel());
}

void CpuBackend::do_rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) {
  const int64_t half = inv_freq.rank() == 2 ? inv_freq.dim(1) : inv_freq.numel();
  const float* freq = f32(inv_freq, "inv_freq");
  const bool has_long = inv_freq.rank() == 2;
  SHARDLM_CHECK(has_long || meta.long_rope() == nullptr, "rope: the step marks long-rope tokens, but inv_freq ",
                inv_freq.describe(), " has no long table");
  backend::rope(f32_mut(x, "rope x"), x.dim(0), x.dim(1), x.dim(2), meta.positions(), freq, half * 2, mscale,
                has_long ? freq + half : nullptr, has_long ? meta.long_rope() : nullptr);
}

void CpuBackend::do_silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  backend::silu_mul(f32(gate, "gate"), f32(up, "up"), gate.numel(), f32_mut(out, "silu_mul out"));
}

void CpuBackend::do_gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  backend::gelu_tanh_mul(f32(gate, "gate"), f32(up, "up"), gate.numel(), f32_mut(out, "gelu_tanh_mul out"));
}

void CpuBackend::do_scale(Tensor& x, float s) { backend::scale_inplace(f32_mut(x, "scale x"), x.numel(), s); }

void CpuBackend::do_kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k,
                                const Tensor& v) {
  backend::kv_cache_write(cache, meta.seqs(cache.group), meta.n_seqs(), f32(k, "k"), f32(v, "v"));
}

void CpuBackend::do_paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                                 const AttentionHeads& heads, Tensor& out) {
  backend::paged_attention(f32(q, "q"), cache, meta.seqs(cache.group), meta.n_seqs(), heads, f32_mut(out, "attention out"));
}

void CpuBackend::do_gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) {
  const int64_t d = cols_of(x);
  const float* src = f32(x, "x");
  float* dst = f32_mut(out, "out");
  for (int64_t i = 0; i < meta.n_logits(); ++i)
    std::memcpy(dst + i * d, src + static_cast<int64_t>(meta.logit_rows()[i]) * d, static_cast<size_t>(d) * sizeof(float));
}

void CpuBackend::do_moe_route(const Tensor& logits, int64_t top_k, bool renormalize, Tensor& ids, Tensor& weights) {
  const int64_t n = rows_of(logits), n_experts = cols_of(logits);
  backend::moe_route(f32(logits, "router logits"), n, n_experts, top_k, renormalize, static_cast<int32_t*>(ids.data()),
                     f32_mut(weights, "routing weights"));
}

void CpuBackend::do_moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertLinears* experts,
                             int64_t n_experts_local, int64_t expert_begin, Tensor& out) {
  const int64_t n = rows_of(x), hidden = cols_of(x), top_k = n > 0 ? ids.numel() / n : 0;
  moe_views_.resize(static_cast<size_t>(n_experts_local));
  for (int64_t e = 0; e < n_experts_local; ++e)
    moe_views_[e] = {matrix(experts[e].gate), matrix(experts[e].up), matrix(experts[e].down)};
  backend::moe_experts(f32(x, "moe x"), n, hidden, static_cast<const int32_t*>(ids.data()), f32(weights, "weights"),
                       top_k, moe_views_.data(), expert_begin, n_experts_local, f32_mut(out, "moe out"), moe_scratch_);
}

}  // namespace shardlm::backend
