#include "backend/device/device_choice.h"

#include <charconv>

#include "core/error.h"

namespace shardlm::backend {

DeviceFlag parse_device_flag(std::string_view text) {
  DeviceFlag f;
  if (text == "cpu") return f;
  if (text == "cuda") {
    f.device = Device{DeviceKind::kCuda, 0};
    return f;
  }
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (!digits.empty() && ec == std::errc() && end == digits.data() + digits.size() && index >= 0) {
      f.device = Device{DeviceKind::kCuda, index};
      f.index_given = true;
      return f;
    }
  }
  fail(ErrorCode::kInvalidArgument, "--device \"", text,
       "\": use cpu, cuda (one GPU per rank under mpirun; GPU 0 otherwise) or cuda:N (GPU N)");
}

Device device_for_rank(const RankPlacement& p) {
  if (p.flag.device.is_cpu()) return p.flag.device;
  if (p.n_devices < 1)
    fail(ErrorCode::kUnsupported, "--device ", p.flag.device.to_string(),
         ": this process sees no CUDA device; `shardlm doctor` shows the driver and devices (CUDA_VISIBLE_DEVICES may "
         "hide them), or use --device cpu");
  if (p.ranks_are_processes && p.n_local_ranks > 1) {
    if (p.flag.index_given)
      fail(ErrorCode::kInvalidArgument, "--device ", p.flag.device.to_string(), " with ", p.n_local_ranks,
           " ranks on this host: every rank would take GPU ", p.flag.device.index,
           ", and NCCL needs one device per rank; use --device cuda (rank r takes GPU r % ", p.n_devices, ")");
    if (p.n_local_ranks > p.n_devices)
      fail(ErrorCode::kInvalidArgument, "mpirun put ", p.n_local_ranks, " ranks on this host but it has ", p.n_devices,
           " GPU(s); NCCL needs one device per rank: start at most ", p.n_devices,
           " processes per host, or run the ranks as threads sharing one GPU (without mpirun)");
    return Device{DeviceKind::kCuda, p.local_rank % p.n_devices};
  }
  if (p.flag.device.index >= p.n_devices)
    fail(ErrorCode::kInvalidArgument, "--device ", p.flag.device.to_string(), ": this process sees ", p.n_devices,
         " CUDA device(s), cuda:0 to cuda:", p.n_devices - 1, " (CUDA_VISIBLE_DEVICES changes which)");
  return p.flag.device;  // one process: every rank (thread) on this GPU
}

}  // namespace shardlm::backend
