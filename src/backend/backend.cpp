#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

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
  }
  return "an unknown op";
}

void Backend::require(const OpArgs& args) const {
  const std::string why = unsupported(args);
  if (why.empty()) return;
  fail(ErrorCode::kUnsupported, describe(args), " is not supported on ", device().to_string(), " (backend ", name(),
       "): ", why);
}

void Backend::sample_rows(const Tensor&, std::span<const DeviceSampleRow>, int32_t*, float*) {
  fail(ErrorCode::kUnsupported, "sampling on the device is not supported on ", name(),
       "; its rows are sampled on the host");
}

void Backend::moe_route(const Tensor&, int64_t, bool, Tensor&, Tensor&) {
  fail(ErrorCode::kUnsupported, "moe_route (mixture-of-experts routing) is not supported on ", name(),
       "; run this MoE model on the CPU backend");
}

void Backend::moe_experts(const Tensor&, const Tensor&, const Tensor&, const ExpertLinears*, int64_t, int64_t,
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
