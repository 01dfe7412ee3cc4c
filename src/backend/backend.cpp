#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace shardlm::backend {

void Backend::require_support(WeightScheme scheme, int bits) const {
  if (supports(scheme, bits)) return;
  fail(ErrorCode::kUnsupported, "quantized ", weight_scheme_name(scheme),
       scheme == WeightScheme::kFp8 ? std::string() : " " + std::to_string(bits) + "-bit",
       " is not supported on ", device().to_string(), " (backend ", name(),
       "); run it on the cpu backend, or use the unquantized checkpoint");
}

#if !defined(SHARDLM_HAVE_CUDA)
std::shared_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device.is_cpu()) return std::make_shared<CpuBackend>(options.n_threads);
  fail(ErrorCode::kUnsupported, "device ", options.device.to_string(),
       ": this shardlm was built without CUDA; rebuild with -DSHARDLM_CUDA=ON (needs the CUDA toolkit)");
}
#endif

}  // namespace shardlm::backend
