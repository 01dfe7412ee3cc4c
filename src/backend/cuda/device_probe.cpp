#include "backend/cuda/device_probe.h"

#include <cuda_runtime.h>
#if defined(SHARDLM_HAVE_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <string>

namespace shardlm::backend::cuda {

namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

GpuReport probe_gpus() {
  GpuReport r;
  r.built_with_cuda = true;
  cudaDriverGetVersion(&r.driver_version);
  cudaRuntimeGetVersion(&r.runtime_version);
#if defined(SHARDLM_HAVE_NCCL)
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) r.nccl_version = nccl;
#endif
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess || n == 0) {
    r.unavailable = st != cudaSuccess ? std::string(cudaGetErrorName(st)) + ": " + cudaGetErrorString(st)
                                      : "the driver reports no CUDA devices";
    if (r.driver_version == 0) r.unavailable += " (no NVIDIA driver is loaded)";
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuDeviceInfo d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    d.n_sms = prop.multiProcessorCount;
    d.total_bytes = prop.totalGlobalMem;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, i) == cudaSuccess) d.pci_bus_id = bus;
    std::string sys = d.pci_bus_id;
    std::transform(sys.begin(), sys.end(), sys.begin(), [](unsigned char c) { return std::tolower(c); });
    const std::string numa = read_line("/sys/bus/pci/devices/" + sys + "/numa_node");
    if (!numa.empty()) d.numa_node = std::atoi(numa.c_str());
    d.local_cpus = read_line("/sys/bus/pci/devices/" + sys + "/local_cpulist");
    if (cudaSetDevice(i) == cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) d.free_bytes = free_b;
    }
    r.devices.push_back(d);
  }
  const size_t m = r.devices.size();
  r.peer_access.assign(m, std::vector<int>(m, 0));
  r.peer_rank.assign(m, std::vector<int>(m, 0));
  for (size_t i = 0; i < m; ++i)
    for (size_t j = 0; j < m; ++j) {
      if (i == j) continue;
      int can = 0, rank = 0;
      cudaDeviceCanAccessPeer(&can, static_cast<int>(i), static_cast<int>(j));
      cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, static_cast<int>(i), static_cast<int>(j));
      r.peer_access[i][j] = can;
      r.peer_rank[i][j] = rank;
    }
  return r;
}

}  // namespace shardlm::backend::cuda
