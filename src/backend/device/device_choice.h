// Which device each rank drives: the --device flag and the rank → GPU rule,
// as pure functions (no CUDA here, so they are unit-tested on CPU).
//
// Two ways to put ranks on GPUs:
//   - processes (mpirun, one per GPU): the production model. A rank owns one
//     device, its context and its NCCL communicator, which is what NCCL
//     needs (one device per rank), and a crashed rank is a dead process that
//     mpirun sees. Rank r on a host uses GPU (local rank % GPUs on the host);
//     more ranks than GPUs on a host is refused, since NCCL cannot put two
//     ranks on one device.
//   - threads (no mpirun): every rank of the group shares ONE device, through
//     the device-local communicator (comm/cuda). This is for checking uneven
//     layouts on a single GPU (TP 2, 3, 4, 6 on one H200), not for speed.
#pragma once

#include <string>
#include <string_view>

#include "core/tensor.h"

namespace shardlm::backend {

struct DeviceFlag {
  Device device;             // cpu, or cuda:index
  bool index_given = false;  // "cuda:1" rather than "cuda"
};

// "cpu", "cuda" (index 0 unless the rank rule picks one), "cuda:N". Throws
// Error(kInvalidArgument) naming --device and the accepted forms.
DeviceFlag parse_device_flag(std::string_view text);

struct RankPlacement {
  DeviceFlag flag;
  bool ranks_are_processes = false;  // under mpirun
  int local_rank = 0;                // this rank's index among the ranks on its host
  int n_local_ranks = 1;             // ranks (processes or threads) on this host
  int n_devices = 0;                 // CUDA devices this process sees
};

// The device this rank drives. cpu stays cpu. Throws Error(kUnsupported)
// when no CUDA device is visible, Error(kInvalidArgument) for an index past
// the devices, for more processes on a host than GPUs, and for an explicit
// cuda:N under mpirun with several ranks on the host (each would take GPU N).
Device device_for_rank(const RankPlacement& placement);

}  // namespace shardlm::backend
