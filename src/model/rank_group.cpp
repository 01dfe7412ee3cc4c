#include "model/rank_group.h"

#include <algorithm>
#include <thread>

#include "comm/local_comm.h"
#include "core/error.h"
#if defined(SHARDLM_HAVE_DEVICE_LOCAL_COMM)
#include "backend/cuda/cuda_backend.h"
#include "comm/cuda/device_local_comm.h"
#endif

namespace shardlm {

bool device_group_supported(const Layout& layout, std::string* why) {
  if (layout.pp > 1) {
    *why = str_cat("pipeline stages (--pp ", layout.pp, ") as threads on one GPU are not implemented; use --pp 1, "
                   "or one process per GPU under mpirun");
    return false;
  }
#if !defined(SHARDLM_HAVE_DEVICE_LOCAL_COMM)
  if (layout.tp > 1) {
    *why = str_cat("--tp ", layout.tp, " as threads on one GPU needs the device-local communicator, which this build "
                   "lacks (configure with -DSHARDLM_CUDA=ON and -DSHARDLM_MPI=ON)");
    return false;
  }
#endif
  return true;
}

void RankContext::abort(const char* what) noexcept {
  if (comms.tp) comms.tp->abort(what);
  if (comms.pp) comms.pp->abort(what);
  if (device_world) device_world->abort(what);
  world.abort(what);
}

RankGroupFactory::RankGroupFactory(const Layout& layout, Device device, int n_threads_per_rank, bool batch_invariant)
    : layout_(layout), device_(device), n_threads_per_rank_(n_threads_per_rank), batch_invariant_(batch_invariant) {
  if (device.is_cpu()) return;
  std::string why;
  if (!device_group_supported(layout, &why)) fail(ErrorCode::kUnsupported, "--device ", device.to_string(), ": ", why);
#if defined(SHARDLM_HAVE_DEVICE_LOCAL_COMM)
  if (layout.tp * layout.pp > 1) device_group_ = DeviceLocalGroup::create(layout.tp * layout.pp, device.index);
#endif
}

RankContext RankGroupFactory::make(Communicator& world) const {
  const int tp_rank = world.rank() % layout_.tp, pp_rank = world.rank() / layout_.tp;
  auto rank_backend = backend::make_backend({device_, n_threads_per_rank_, batch_invariant_});
  if (!device_group_) {
    // CPU, or one rank on a GPU (its collectives are the identity): host communicators serve.
    return RankContext{world, split_rank_comms(world, layout_), std::move(rank_backend), tp_rank, pp_rank, nullptr};
  }
#if defined(SHARDLM_HAVE_DEVICE_LOCAL_COMM)
  auto* cuda_backend = dynamic_cast<backend::cuda::CudaBackend*>(rank_backend.get());
  SHARDLM_CHECK(cuda_backend != nullptr, "a ", device_.to_string(), " backend that is not CudaBackend");
  auto& group = *static_cast<DeviceLocalGroup*>(device_group_.get());
  std::unique_ptr<DeviceLocalComm> device_world = group.make(world.rank());
  RankComms comms = split_rank_comms(*device_world, layout_);
  // Collectives on the backend's stream: ordered with the ops that make and use their buffers.
  static_cast<DeviceLocalComm&>(*comms.tp).use_stream(cuda_backend->stream());
  static_cast<DeviceLocalComm&>(*comms.pp).use_stream(cuda_backend->stream());
  return RankContext{world, std::move(comms), std::move(rank_backend), tp_rank, pp_rank, std::move(device_world)};
#else
  fail(ErrorCode::kInternal, "a device-local group in a build without the device-local communicator");
#endif
}

void run_rank_group(const Layout& layout, Device device, int n_threads_per_rank,
                    const std::function<void(RankContext&)>& body, bool batch_invariant) {
  const RankGroupFactory factory(layout, device, n_threads_per_rank, batch_invariant);
  run_local_ranks(layout.tp * layout.pp, [&](Communicator& world) {
    RankContext ctx = factory.make(world);
    try {
      body(ctx);
    } catch (...) {
      ctx.abort("a rank of the group failed");
      throw;
    }
  });
}

}  // namespace shardlm
