#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace shardlm::backend {

void Backend::moe_route(const Tensor&, int64_t, bool, Tensor&, Tensor&) {
  fail(ErrorCode::kUnsupported, "moe_route (mixture-of-experts routing) is not supported on ", name(),
       "; run this MoE model on the CPU backend");
}

void Backend::moe_experts(const Tensor&, const Tensor&, const Tensor&, const ExpertLinears*, int64_t, int64_t,
                          Tensor&) {
  fail(ErrorCode::kUnsupported, "moe_experts (mixture-of-experts expert MLPs) is not supported on ", name(),
       "; run this MoE model on the CPU backend");
}

#if !defined(SHARDLM_HAVE_CUDA)
std::shared_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device.is_cpu()) return std::make_shared<CpuBackend>(options.n_threads);
  fail(ErrorCode::kUnsupported, "device ", options.device.to_string(),
       ": this shardlm was built without CUDA; rebuild with -DSHARDLM_CUDA=ON (needs the CUDA toolkit)");
}
#endif

}  // namespace shardlm::backend
