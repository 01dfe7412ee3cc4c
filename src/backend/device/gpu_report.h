// What `shardlm doctor` reports about a machine's GPUs, as plain data: the
// CUDA build fills it from the runtime (backend/cuda/device_probe.h); tests
// fill it by hand, so the report's text and advice are tested on CPU.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::backend {

struct GpuDeviceInfo {
  int index = 0;
  std::string name;        // "NVIDIA H200"
  std::string pci_bus_id;  // "0000:19:00.0"
  int cc_major = 0, cc_minor = 0;
  int n_sms = 0;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int numa_node = -1;       // from /sys/bus/pci/devices/<bus id>/numa_node; -1 unknown
  std::string local_cpus;   // /sys/bus/pci/devices/<bus id>/local_cpulist, "" unknown
};

struct GpuReport {
  bool built_with_cuda = false;
  std::string unavailable;  // why no device could be used ("" when devices were found)
  int driver_version = 0;   // cudaDriverGetVersion: 13000 = 13.0; 0 unknown
  int runtime_version = 0;  // cudaRuntimeGetVersion
  int nccl_version = 0;     // ncclGetVersion: 22703 = 2.27.3; 0 unknown
  std::vector<GpuDeviceInfo> devices;
  // [i][j]: cudaDeviceCanAccessPeer(i, j) (1/0), and the P2P performance rank
  // (cudaDevP2PAttrPerformanceRank: 0 is the best link the driver knows).
  std::vector<std::vector<int>> peer_access;
  std::vector<std::vector<int>> peer_rank;
};

// The NCCL_* variables (and CUDA_VISIBLE_DEVICES) among env entries "NAME=value", sorted by name.
std::vector<std::pair<std::string, std::string>> nccl_environment(const std::vector<std::string>& env);

// True when /proc/version's text names a WSL2 kernel ("microsoft").
bool is_wsl(const std::string& proc_version);

// "13.0" from 13000; "2.27.3" from NCCL's 22703 (or 2.x codes < 10000: 2708 = 2.7.8).
std::string cuda_version_text(int version);
std::string nccl_version_text(int version);

// The whole report: versions, one line per device, the peer-access matrix,
// NUMA affinity, the NCCL_* variables in effect and what the usual remedies
// (NCCL_P2P_DISABLE, NCCL_SOCKET_IFNAME, NCCL_SHM_DISABLE under WSL2) cost and
// when each is the right fix, with a note on the ones set now.
std::string format_gpu_report(const GpuReport& report, const std::vector<std::pair<std::string, std::string>>& env,
                              bool wsl);

}  // namespace shardlm::backend
