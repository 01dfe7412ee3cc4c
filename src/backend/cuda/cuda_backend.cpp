#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <mutex>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/device_memory.h"
#include "core/error.h"

namespace shardlm::backend::cuda {

// Allocations of every backend in this process are measured one at a time:
// two ranks (threads) sharing a GPU would otherwise each see the other's
// cudaMalloc in their cudaMemGetInfo delta.
namespace {
std::mutex& measure_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

struct CudaAllocState {
  explicit CudaAllocState(int device) : info(device), accounting(info) {}
  CudaMemInfo info;
  DeviceMemoryAccounting accounting;
};

namespace {

constexpr size_t kScratchGranule = size_t{1} << 20;  // scratch grows in MiB steps, so regrowth is rare
constexpr size_t kWeightAlignment = 256;              // each weight in the pool starts on a 256-byte boundary

int64_t rows_of(const Tensor& t) { return t.rank() <= 1 ? 1 : t.numel() / t.dim(t.rank() - 1); }
int64_t cols_of(const Tensor& t) { return t.rank() == 0 ? 0 : t.dim(t.rank() - 1); }

void check_on_cuda(const Tensor& t, const char* what) {
  SHARDLM_CHECK(t.defined() && t.device().kind == DeviceKind::kCuda, what, ": expected a tensor on a CUDA device, got ",
                t.describe());
}
const float* f32(const Tensor& t, const char* what) {
  check_on_cuda(t, what);
  SHARDLM_CHECK(t.dtype() == DType::kF32, what, ": expected f32, got ", t.describe());
  return static_cast<const float*>(t.data());
}
float* f32_mut(Tensor& t, const char* what) { return const_cast<float*>(f32(t, what)); }
const bf16* bf16_of(const Tensor& t, const char* what) {
  check_on_cuda(t, what);
  SHARDLM_CHECK(t.dtype() == DType::kBF16, what, ": the CUDA backend holds weights in bf16, got ", t.describe());
  return static_cast<const bf16*>(t.data());
}

DeviceKvLayer device_kv(const KvLayerView& c, const char* op) {
  if (c.dtype != DType::kBF16)
    fail(ErrorCode::kUnsupported, op, ": the CUDA KV cache is bf16, this one is ", dtype_safetensors_name(c.dtype),
         "; use --kv-cache-dtype bf16 (or auto on a bf16 checkpoint) with --device cuda");
  return {static_cast<bf16*>(c.k), static_cast<bf16*>(c.v), c.n_blocks, c.block_size, c.n_kv_heads, c.head_dim};
}

// Device memory charged to category, released (and the release measured) when the last owner goes.
std::shared_ptr<void> measured_alloc(const std::shared_ptr<CudaAllocState>& state, int device, MemCategory category,
                                     size_t bytes) {
  const size_t asked = std::max<size_t>(bytes, 256);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(measure_mutex());
    SHARDLM_CUDA_CHECK(cudaSetDevice(device));
    state->accounting.measure(category, asked, [&] {
      const cudaError_t st = cudaMalloc(&p, asked);
      if (st != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        fail(ErrorCode::kOutOfMemory, "GPU ", device, ": cannot allocate ", asked, " bytes for ",
             mem_category_name(category), " (", cudaGetErrorName(st), "; ", free_b, " of ", total_b,
             " bytes free); lower --gpu-memory-utilization or --max-num-seqs, or use more -tp ranks");
      }
    });
  }
  return std::shared_ptr<void>(p, [state, device, category, asked](void* q) {
    std::lock_guard<std::mutex> lock(measure_mutex());
    try {
      cudaSetDevice(device);
      state->accounting.measure_release(category, asked, [&] { cudaFree(q); });
    } catch (...) {
      cudaFree(q);  // a deleter never throws; the figure is off only when the device already failed
    }
  });
}

}  // namespace

int visible_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

DeviceMemInfo device_memory_info(int device) {
  const int n = visible_device_count();
  if (device < 0 || device >= n)
    fail(ErrorCode::kInvalidArgument, "cuda:", device, ": this process sees ", n, " CUDA device(s)");
  SHARDLM_CUDA_CHECK(cudaSetDevice(device));
  size_t free_b = 0, total_b = 0;
  SHARDLM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {.free_bytes = free_b, .total_bytes = total_b};
}

CudaBackend::CudaBackend(int device) : device_(device) {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess || n == 0) {
    cudaGetLastError();
    fail(ErrorCode::kUnsupported, "--device cuda:", device, ": no usable CUDA device (",
         st != cudaSuccess ? cudaGetErrorString(st) : "the driver reports none",
         "); `shardlm doctor` shows the driver and devices, --device cpu runs without one");
  }
  if (device < 0 || device >= n)
    fail(ErrorCode::kInvalidArgument, "--device cuda:", device, ": this machine has ", n, " CUDA device(s), cuda:0 to cuda:",
         n - 1, " (CUDA_VISIBLE_DEVICES changes which)");
  SHARDLM_CUDA_CHECK(cudaSetDevice(device_));
  SHARDLM_CUDA_CHECK(cudaFree(nullptr));  // the context exists before the baseline
  cudaDeviceProp prop{};
  SHARDLM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  name_ = str_cat("cuda:", device_, " (", prop.name, ", sm_", prop.major, prop.minor, ")");
  SHARDLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  {
    std::lock_guard<std::mutex> lock(measure_mutex());
    alloc_ = std::make_shared<CudaAllocState>(device_);
    // cuBLASLt's handle and workspace are the rank's too: measured as workspace.
    alloc_->accounting.measure(MemCategory::kWorkspace, size_t{32} << 20, [&] { gemm_ = std::make_unique<LtGemm>(); });
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (Scratch* s : {&meta_dev_, &x_bf16_, &out_bf16_, &attn_ws_, &sample_rows_, &sample_work_, &sample_out_})
    free_scratch(*s);
  {
    std::lock_guard<std::mutex> lock(measure_mutex());
    gemm_.reset();
  }
  if (stream_) cudaStreamDestroy(stream_);
}

// ---- memory ------------------------------------------------------------------

int64_t CudaBackend::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(measure_mutex());
  return static_cast<int64_t>(alloc_->accounting.measured_total());
}

uint64_t CudaBackend::measured_bytes(MemCategory category) const {
  std::lock_guard<std::mutex> lock(measure_mutex());
  return alloc_->accounting.measured(category);
}

std::string CudaBackend::memory_summary() const {
  std::lock_guard<std::mutex> lock(measure_mutex());
  return alloc_->accounting.summary();
}

Tensor CudaBackend::alloc(DType dtype, TensorShape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  std::shared_ptr<void> storage = measured_alloc(alloc_, device_, MemCategory::kWorkspace, bytes);
  SHARDLM_CUDA_CHECK(cudaMemsetAsync(storage.get(), 0, std::max<size_t>(bytes, 1), stream_));
  void* p = storage.get();
  return Tensor::owning(std::move(storage), p, dtype, shape, device());
}

Tensor CudaBackend::adopt_weight(Tensor host) {
  SHARDLM_CHECK(host.device().is_cpu(), "adopt_weight takes a host tensor, got ", host.describe());
  if (host.dtype() != DType::kBF16)
    fail(ErrorCode::kUnsupported, "the CUDA backend keeps weights in bf16 as stored and has no kernels for a ",
         host.describe(), " weight; use a bf16 checkpoint (make-model --dtype bf16), or --device cpu for f32, f16 "
         "and quantized weights");
  SHARDLM_CUDA_CHECK(cudaSetDevice(device_));
  std::shared_ptr<void> storage;
  const size_t aligned = (host.nbytes() + kWeightAlignment - 1) / kWeightAlignment * kWeightAlignment;
  if (weight_pool_ && weight_pool_used_ + aligned <= weight_pool_bytes_) {
    // Shares ownership of the pool; the pool goes when its last weight does.
    storage = std::shared_ptr<void>(weight_pool_, static_cast<char*>(weight_pool_.get()) + weight_pool_used_);
    weight_pool_used_ += aligned;
    if (weight_pool_used_ == weight_pool_bytes_) weight_pool_.reset();
  } else {
    storage = measured_alloc(alloc_, device_, MemCategory::kWeights, host.nbytes());
  }
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(storage.get(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` may be a temporary slice
  void* p = storage.get();
  return Tensor::owning(std::move(storage), p, host.dtype(), host.shape(), device());
}

void CudaBackend::reserve_weights(int64_t bytes, int64_t n_tensors) {
  weight_pool_.reset();  // a pool from an earlier load keeps living in its weights
  weight_pool_bytes_ = weight_pool_used_ = 0;
  if (bytes <= 0 || n_tensors <= 0) return;
  weight_pool_bytes_ = static_cast<size_t>(bytes) + static_cast<size_t>(n_tensors) * kWeightAlignment;
  weight_pool_ = measured_alloc(alloc_, device_, MemCategory::kWeights, weight_pool_bytes_);
}

void CudaBackend::upload(const void* host, Tensor& dst) {
  check_on_cuda(dst, "upload");
  // From pageable memory the copy is staged before this returns, so `host` may be reused.
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::download(const Tensor& src, void* host) {
  check_on_cuda(src, "download");
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(host, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() { SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void* CudaBackend::scratch(Scratch& s, size_t bytes) {
  if (bytes <= s.bytes) return s.data;
  // Growing means a synchronize and a cudaMalloc, which a stream capture
  // forbids: say so plainly. The capture then fails and the step runs
  // eagerly, growing the buffer; its new epoch drops every graph, so the
  // failed bucket is tried again after its next warm-up.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone) {
    fail(ErrorCode::kInternal, "a CUDA scratch buffer of ", s.bytes, " bytes would grow to ", bytes,
         " during a CUDA graph capture (the warm-up step of this batch size did not size it)");
  }
  free_scratch(s);
  const size_t want = (bytes + kScratchGranule - 1) / kScratchGranule * kScratchGranule;
  std::lock_guard<std::mutex> lock(measure_mutex());
  alloc_->accounting.measure(MemCategory::kWorkspace, want, [&] { SHARDLM_CUDA_CHECK(cudaMalloc(&s.data, want)); });
  s.bytes = want;
  ++buffer_epoch_;  // a graph that baked the old address in is stale
  return s.data;
}

void CudaBackend::free_scratch(Scratch& s) {
  if (!s.data) return;
  cudaStreamSynchronize(stream_);  // no enqueued op still reads it
  std::lock_guard<std::mutex> lock(measure_mutex());
  try {
    alloc_->accounting.measure_release(MemCategory::kWorkspace, s.bytes, [&] { cudaFree(s.data); });
  } catch (...) {
    cudaFree(s.data);
  }
  s = Scratch{};
}

// ---- one step ----------------------------------------------------------------

void CudaBackend::begin_step(const StepMetadata& meta) {
  SHARDLM_CUDA_CHECK(cudaSetDevice(device_));
  const std::span<const int32_t> packed = meta.packed();
  void* dst = scratch(meta_dev_, std::max<size_t>(packed.size_bytes(), 4));
  if (!packed.empty())
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(dst, packed.data(), packed.size_bytes(), cudaMemcpyHostToDevice, stream_));
  step_ = &meta;
  step_n_tokens_ = meta.n_tokens();
  step_n_seqs_ = meta.n_seqs();
  step_n_logits_ = meta.n_logits();
  step_max_context_ = step_max_chunk_ = 0;
  step_all_decode_ = step_n_seqs_ > 0;
  for (int64_t s = 0; s < step_n_seqs_; ++s) {
    const AttentionSeq& q = meta.seqs()[s];
    step_max_context_ = std::max(step_max_context_, q.n_past + q.n_tokens);
    step_max_chunk_ = std::max(step_max_chunk_, q.n_tokens);
    step_all_decode_ = step_all_decode_ && q.n_tokens <= 1;  // padding rows (0 tokens) of a graph bucket included
  }
  // A graph step's attention is sized by the bound, not by this step, so the
  // partition count its graph baked in serves every later step.
  if (step_all_decode_ && graph_max_context_ > 0) step_max_context_ = std::max(step_max_context_, graph_max_context_);
}

std::unique_ptr<GraphStepRunner> CudaBackend::make_graph_runner(std::function<void(int n_rows)> enqueue_step) {
  return std::make_unique<CudaGraphRunner>(stream_, std::move(enqueue_step));
}

void CudaBackend::set_decode_graph_bounds(int64_t max_rows, int64_t max_context) {
  SHARDLM_CHECK(max_rows >= 0 && max_context >= 0, "decode graph bounds: rows ", max_rows, ", context ", max_context);
  graph_max_rows_ = max_rows;
  graph_max_context_ = max_context;
}

void CudaBackend::check_step(const StepMetadata& meta, const char* op) const {
  SHARDLM_CHECK(&meta == step_ && meta.n_tokens() == step_n_tokens_ && meta.n_seqs() == step_n_seqs_, op,
                ": its StepMetadata is not the one begin_step uploaded");
}

DeviceSeqs CudaBackend::device_seqs() const {
  const int32_t* base = static_cast<const int32_t*>(meta_dev_.data);
  return {base + step_->seq_records_offset(), base + step_->block_tables_offset(), step_n_seqs_};
}

void CudaBackend::do_embed(const Tensor& table, int64_t vocab_begin, int64_t vocab_end, int64_t vocab_size,
                        const StepMetadata& meta, Tensor& out) {
  check_step(meta, "embed");
  const int64_t n = meta.n_tokens(), h = cols_of(table);
  (void)vocab_size;  // every id was checked against it on the host by Backend::embed, before any launch
  embedding_gather(bf16_of(table, "embed table"), vocab_end - vocab_begin, h, vocab_begin,
                   static_cast<const int32_t*>(meta_dev_.data), n, f32_mut(out, "embed out"), stream_);
}

void CudaBackend::do_matmul(const Tensor& x, const Linear& w, Tensor& y) {
  if (w.quantized())
    fail(ErrorCode::kUnsupported, "matmul on ", name(), ": ", describe(OpArgs::quant_matmul(w.quant.scheme, w.quant.bits)),
         " has no CUDA kernel");
  const int64_t n = rows_of(x), m = w.weight.dim(0), k = w.weight.dim(1);
  auto* xb = static_cast<bf16*>(scratch(x_bf16_, static_cast<size_t>(n * k) * sizeof(bf16)));
  f32_to_bf16(f32(x, "matmul x"), n * k, xb, stream_);
  float* out = f32_mut(y, "matmul y");
  gemm_->matmul(xb, n, bf16_of(w.weight, "matmul weight"), m, k, out, stream_);
  if (w.bias.defined()) add_bias(out, bf16_of(w.bias, "matmul bias"), n, m, stream_);
}

void CudaBackend::do_rms_norm(const Tensor& x, const NormWeight& weight, float eps, Tensor& out) {
  const Tensor& w = weight.weight;
  rms_norm_f32(f32(x, "rms_norm x"), rows_of(x), cols_of(x), bf16_of(w, "rms_norm weight"), eps, weight.offset,
               f32_mut(out, "rms_norm out"), stream_);
}

void CudaBackend::do_add_rms_norm(Tensor& hidden, const Tensor& delta, const NormWeight& weight, float eps, Tensor& out) {
  const Tensor& w = weight.weight;
  auto* ob = static_cast<bf16*>(scratch(out_bf16_, static_cast<size_t>(out.numel()) * sizeof(bf16)));
  rms_norm_residual(f32_mut(hidden, "add_rms_norm hidden"), f32(delta, "add_rms_norm delta"), rows_of(hidden),
                    cols_of(hidden), bf16_of(w, "add_rms_norm weight"), eps, weight.offset, ob, stream_);
  bf16_to_f32(ob, out.numel(), f32_mut(out, "add_rms_norm out"), stream_);
}

void CudaBackend::do_add(Tensor& y, const Tensor& x) {
  add_f32(f32_mut(y, "add y"), f32(x, "add x"), y.numel(), stream_);
}

void CudaBackend::do_scale(Tensor& x, float s) { scale_f32(f32_mut(x, "scale x"), x.numel(), s, stream_); }
void CudaBackend::do_softcap(Tensor& x, float cap) { softcap_f32(f32_mut(x, "softcap x"), x.numel(), cap, stream_); }

void CudaBackend::do_rope(Tensor& x, const Tensor& inv_freq, const StepMetadata& meta, float mscale) {
  check_step(meta, "rope");
  const int64_t half = inv_freq.rank() == 2 ? inv_freq.dim(1) : inv_freq.numel();
  // Row 0 of a LongRoPE table is the short factors'; the long ones are not
  // carried to the device yet.
  if (meta.long_rope() != nullptr)
    fail(ErrorCode::kUnsupported, "LongRoPE's long factors (positions past original_max_position_embeddings, or a "
         "prompt longer than it) run on the CPU backend only; on ", name(), " keep --max-model-len at most "
         "original_max_position_embeddings");
  const int32_t* positions = static_cast<const int32_t*>(meta_dev_.data) + step_n_tokens_;
  backend::cuda::rope(f32_mut(x, "rope x"), x.dim(0), x.dim(1), x.dim(2), x.dim(1) * x.dim(2), positions,
                      f32(inv_freq, "rope inv_freq"), half * 2, mscale, stream_);
}

void CudaBackend::do_silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  auto* ob = static_cast<bf16*>(scratch(out_bf16_, static_cast<size_t>(out.numel()) * sizeof(bf16)));
  backend::cuda::silu_mul(f32(gate, "silu_mul gate"), f32(up, "silu_mul up"), rows_of(gate), cols_of(gate),
                          cols_of(gate), ob, stream_);
  bf16_to_f32(ob, out.numel(), f32_mut(out, "silu_mul out"), stream_);
}

void CudaBackend::do_kv_cache_write(const KvLayerView& cache, const StepMetadata& meta, const Tensor& k,
                                 const Tensor& v) {
  check_step(meta, "kv_cache_write");
  const int64_t row = cache.n_kv_heads * cache.head_dim;
  backend::cuda::kv_cache_write(device_kv(cache, "kv_cache_write"), f32(k, "k"), f32(v, "v"), row, device_seqs(),
                                meta.n_tokens(), stream_);
}

void CudaBackend::do_gelu_tanh_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  auto* ob = static_cast<bf16*>(scratch(out_bf16_, static_cast<size_t>(out.numel()) * sizeof(bf16)));
  backend::cuda::gelu_tanh_mul(f32(gate, "gelu_tanh_mul gate"), f32(up, "gelu_tanh_mul up"), rows_of(gate),
                               cols_of(gate), cols_of(gate), ob, stream_);
  bf16_to_f32(ob, out.numel(), f32_mut(out, "gelu_tanh_mul out"), stream_);
}

std::string CudaBackend::unsupported(const OpArgs& args) const {
  switch (args.op) {
    case Op::kMatmul:
      if (args.scheme == WeightScheme::kDense && args.weight_dtype != DType::kBF16)
        return str_cat("weights stored as ", dtype_torch_name(args.weight_dtype),
                       " (the CUDA backend keeps bf16 weights)");
      break;
    case Op::kPagedAttention: {
      if (!attention_head_dim_supported(args.head_dim))
        return str_cat("head_dim ", args.head_dim, " (the attention kernels take ", kAttentionHeadDims, ")");
      const int64_t group = std::min(args.heads.group_size, args.heads.n_q_heads);
      if (group > kMaxAttentionGroup)
        return str_cat(group, " Q heads per KV head on one rank (at most ", kMaxAttentionGroup, ")");
      if (args.kv_dtype && *args.kv_dtype != DType::kBF16)
        return str_cat("a KV cache of ", dtype_torch_name(*args.kv_dtype),
                       " (bf16 only: --kv-cache-dtype bf16, or auto on a bf16 checkpoint)");
      return std::string();
    }
    case Op::kSampleRows: return std::string();
    case Op::kMoe: break;
    case Op::kKvGroups: break;  // the kernels read seqs() only
  }
  return Backend::unsupported(args);
}

void CudaBackend::do_paged_attention(const Tensor& q, const KvLayerView& cache, const StepMetadata& meta,
                                  const AttentionHeads& heads, Tensor& out) {
  check_step(meta, "paged_attention");
  const int64_t hd = cache.head_dim, elems = meta.n_tokens() * heads.n_q_heads * hd;
  const DeviceKvLayer dc = device_kv(cache, "paged_attention");
  auto* ob = static_cast<bf16*>(scratch(out_bf16_, static_cast<size_t>(elems) * sizeof(bf16)));
  const float* qp = f32(q, "attention q");
  if (step_all_decode_) {
    // Sized for the largest graph bucket when graphs are on, so that no bucket regrows it (and moves it),
    // and for the whole context even on a sliding-window layer (which uses less of it), so that the
    // layers of one step (Gemma 3: five local, then a global one) never regrow it between them.
    AttentionHeads sizing = heads;
    sizing.window = 0;
    const size_t ws_bytes = decode_attention_workspace_bytes(std::max(step_n_seqs_, graph_max_rows_), sizing, hd,
                                                             step_max_context_);
    void* ws = ws_bytes ? scratch(attn_ws_, ws_bytes) : nullptr;
    paged_attention_decode(qp, heads.n_q_heads * hd, dc, heads, device_seqs(), step_max_context_, ws, ob, stream_);
  } else {
    paged_attention_prefill(qp, heads.n_q_heads * hd, dc, heads, device_seqs(), step_max_chunk_, ob, stream_);
  }
  bf16_to_f32(ob, elems, f32_mut(out, "attention out"), stream_);
}

void CudaBackend::do_gather_logit_rows(const Tensor& x, const StepMetadata& meta, Tensor& out) {
  check_step(meta, "gather_logit_rows");
  const int64_t d = cols_of(x);
  const int32_t* rows = static_cast<const int32_t*>(meta_dev_.data) + 2 * step_n_tokens_;
  gather_rows_f32(f32(x, "gather_logit_rows x"), d, rows, meta.n_logits(), f32_mut(out, "gather_logit_rows out"),
                  stream_);
}

void CudaBackend::copy_columns(const Tensor& src, Tensor& dst, int64_t col_begin) {
  check_on_cuda(src, "copy_columns src");
  check_on_cuda(dst, "copy_columns dst");
  const int64_t rows = src.rank() == 2 ? src.dim(0) : 0, w = src.rank() == 2 ? src.dim(1) : 0;
  SHARDLM_CHECK(src.rank() == 2 && dst.rank() == 2 && dst.dim(0) == rows && col_begin >= 0 &&
                    col_begin + w <= dst.dim(1) && src.dtype() == dst.dtype(),
                "copy_columns: src ", src.describe(), " into dst ", dst.describe(), " at column ", col_begin);
  if (rows == 0 || w == 0) return;
  const size_t e = dtype_size(src.dtype());
  SHARDLM_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.data()) + static_cast<size_t>(col_begin) * e,
                                       static_cast<size_t>(dst.dim(1)) * e, src.data(), static_cast<size_t>(w) * e,
                                       static_cast<size_t>(w) * e, static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                       stream_));
}

void CudaBackend::do_sample_rows(const Tensor& logits, std::span<const DeviceSampleRow> rows, int32_t* ids,
                              float* logprobs) {
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  const int64_t vocab = logits.dim(1);
  const float* lg = f32(logits, "sample_rows logits");
  std::vector<DeviceSamplingRow> host(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    const DeviceSampleRow& s = rows[static_cast<size_t>(r)];
    DeviceSamplingRow& d = host[static_cast<size_t>(r)];
    d.temperature = s.temperature;
    d.top_k = s.top_k;
    d.top_p = s.top_p;
    d.min_p = s.min_p;
    d.seed = s.seed;
    d.step = s.step;
  }
  // No penalty entries (pen.offsets null): rows with penalties are sampled on the host.
  const size_t rows_bytes = host.size() * sizeof(DeviceSamplingRow);
  char* rows_dev = static_cast<char*>(scratch(sample_rows_, rows_bytes));
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(rows_dev, host.data(), rows_bytes, cudaMemcpyHostToDevice, stream_));
  const DevicePenalties pen{};
  auto* work = static_cast<float*>(scratch(sample_work_, static_cast<size_t>(n * vocab) * sizeof(float)));
  // [ids n][logprobs n][top ids n × k][top logprobs n × k]
  const size_t k = kMaxDeviceLogprobs;
  char* out = static_cast<char*>(scratch(sample_out_, static_cast<size_t>(n) * (2 + 2 * k) * 4));
  auto* d_ids = reinterpret_cast<int32_t*>(out);
  auto* d_lp = reinterpret_cast<float*>(out + n * 4);
  auto* d_top = reinterpret_cast<int32_t*>(out + n * 8);
  auto* d_top_lp = reinterpret_cast<float*>(out + n * 8 + n * k * 4);
  sample(lg, n, vocab, reinterpret_cast<const DeviceSamplingRow*>(rows_dev), pen, work, d_ids, d_lp, d_top, d_top_lp,
         stream_);
  SHARDLM_CUDA_CHECK(cudaMemcpyAsync(ids, d_ids, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
  if (logprobs)
    SHARDLM_CUDA_CHECK(cudaMemcpyAsync(logprobs, d_lp, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream_));
  SHARDLM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

std::shared_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_shared<CudaBackend>(options.device.index);
}

}  // namespace shardlm::backend::cuda
