#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace shardlm::backend {

#if !defined(SHARDLM_HAVE_CUDA)
std::shared_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device.is_cpu()) return std::make_shared<CpuBackend>(options.n_threads);
  fail(ErrorCode::kUnsupported, "device ", options.device.to_string(),
       ": this shardlm was built without CUDA; rebuild with -DSHARDLM_CUDA=ON (needs the CUDA toolkit)");
}
#endif

}  // namespace shardlm::backend
