// Device memory on CUDA, accounted by what the driver says was taken:
// CudaMemInfo is the MemInfoSource over cudaMemGetInfo, and DeviceArena hands
// out buffers whose every cudaMalloc is measured by DeviceMemoryAccounting
// (backend/device/memory_accounting.h), so serve can print measured bytes
// beside plan's prediction.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/device/memory_accounting.h"

namespace shardlm::backend::cuda {

class CudaMemInfo final : public MemInfoSource {
 public:
  explicit CudaMemInfo(int device) : device_(device) {}
  DeviceMemInfo query() override;  // synchronises the device first, so frees have landed

 private:
  int device_;
};

class DeviceArena {
 public:
  explicit DeviceArena(int device);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // bytes of device memory, charged to category by measured delta.
  void* allocate(MemCategory category, size_t bytes);
  DeviceMemoryAccounting& accounting() { return accounting_; }
  int device() const { return device_; }

 private:
  int device_;
  CudaMemInfo info_;
  DeviceMemoryAccounting accounting_;
  std::vector<void*> blocks_;
};

}  // namespace shardlm::backend::cuda
