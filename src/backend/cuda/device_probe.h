// Fills backend::GpuReport from the CUDA runtime and sysfs for `shardlm doctor`.
// Never throws for a missing driver or device: the report says why instead.
#pragma once

#include "backend/device/gpu_report.h"

namespace shardlm::backend::cuda {

GpuReport probe_gpus();

}  // namespace shardlm::backend::cuda
