#include "backend/device/gpu_report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>

namespace shardlm::backend {

namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30));
  return buf;
}

const char* value_of(const std::vector<std::pair<std::string, std::string>>& env, const std::string& name) {
  for (const auto& [k, v] : env)
    if (k == name) return v.c_str();
  return nullptr;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> nccl_environment(const std::vector<std::string>& env) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    if (name.rfind("NCCL_", 0) == 0 || name == "CUDA_VISIBLE_DEVICES" || name == "CUDA_DEVICE_ORDER")
      out.emplace_back(std::move(name), entry.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_wsl(const std::string& proc_version) {
  std::string lower = proc_version;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("microsoft") != std::string::npos;
}

std::string cuda_version_text(int v) {
  if (v <= 0) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string nccl_version_text(int v) {
  if (v <= 0) return "unknown";
  if (v >= 10000) return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 100) + "." + std::to_string(v % 100);
}

std::string format_gpu_report(const GpuReport& r, const std::vector<std::pair<std::string, std::string>>& env,
                              bool wsl) {
  std::ostringstream out;
  out << "shardlm doctor\n\n";
  if (!r.built_with_cuda) {
    out << "GPUs: this shardlm was built without CUDA (configure with -DSHARDLM_CUDA=ON to serve on NVIDIA GPUs);\n"
           "      it serves on CPU ranks only.\n";
  } else {
    out << "CUDA driver " << cuda_version_text(r.driver_version) << ", runtime " << cuda_version_text(r.runtime_version)
        << ", NCCL " << nccl_version_text(r.nccl_version) << "\n";
    if (!r.unavailable.empty()) out << "GPUs: none usable: " << r.unavailable << "\n";
  }
  if (!r.devices.empty()) {
    out << "\nDevices (" << r.devices.size() << "):\n";
    for (const GpuDeviceInfo& d : r.devices) {
      out << "  GPU" << d.index << "  " << d.name << "  sm_" << d.cc_major << d.cc_minor << ", " << d.n_sms
          << " SMs, " << gib(d.total_bytes) << " total, " << gib(d.free_bytes) << " free, PCI " << d.pci_bus_id
          << "\n";
    }
    out << "\nNUMA affinity:\n";
    for (const GpuDeviceInfo& d : r.devices) {
      out << "  GPU" << d.index << "  NUMA node " << (d.numa_node >= 0 ? std::to_string(d.numa_node) : "unknown")
          << ", CPUs " << (d.local_cpus.empty() ? "unknown" : d.local_cpus) << "\n";
    }
    const size_t n = r.devices.size();
    if (n > 1 && r.peer_access.size() == n) {
      out << "\nPeer access (cudaDeviceCanAccessPeer; Y = direct P2P, rank = driver's P2P performance rank, 0 best;\n"
             "  '-' = no P2P: traffic between those GPUs goes through host memory):\n       ";
      for (size_t j = 0; j < n; ++j) out << "  GPU" << j;
      out << "\n";
      for (size_t i = 0; i < n; ++i) {
        out << "  GPU" << i;
        for (size_t j = 0; j < n; ++j) {
          std::string cell = i == j ? "X" : r.peer_access[i][j] ? "Y" : "-";
          if (i != j && r.peer_access[i][j] && r.peer_rank.size() == n) cell += std::to_string(r.peer_rank[i][j]);
          char buf[16];
          std::snprintf(buf, sizeof buf, "%6s", cell.c_str());
          out << buf;
        }
        out << "\n";
      }
      bool any_missing = false;
      for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < n; ++j) any_missing |= i != j && !r.peer_access[i][j];
      if (any_missing)
        out << "  Some pairs have no P2P: NCCL routes them through host memory (SHM), which is slower but correct;\n"
               "  consumer cards (4090) and GPUs on different CPU sockets commonly show this.\n";
    }
  }

  out << "\nNCCL environment in effect:\n";
  if (env.empty()) out << "  (none set: NCCL picks transports itself)\n";
  for (const auto& [k, v] : env) out << "  " << k << "=" << v << "\n";

  out << "\nCommon remedies, what they cost, and when they are right:\n"
         "  NCCL_P2P_DISABLE=1   stops direct GPU-to-GPU copies (NVLink/PCIe P2P); traffic goes through host\n"
         "                       memory, often 2-5x slower all-reduce. Right only when P2P is broken (hangs or\n"
         "                       wrong results with IOMMU/ACS enabled, some consumer boards or VMs); fix the\n"
         "                       platform (disable ACS, IOMMU passthrough) if you can instead.\n"
         "  NCCL_SOCKET_IFNAME=  picks the network interface for bootstrap and socket transport (e.g. eth0,\n"
         "                       ^docker0,lo to exclude). Costs nothing; right when hosts have several interfaces\n"
         "                       and NCCL chose one the peers cannot reach (docker bridges, VPNs): the symptom\n"
         "                       is a hang or timeout at communicator setup across hosts.\n"
         "  NCCL_SHM_DISABLE=1   stops the shared-memory transport between processes of one host; NCCL falls\n"
         "                       back to sockets, much slower. Right under WSL2, whose /dev/shm is too small or\n"
         "                       lacks the semantics NCCL needs (errors or hangs at init); elsewhere prefer\n"
         "                       enlarging /dev/shm (docker --shm-size) to disabling it.\n";
  if (wsl)
    out << "  This machine runs WSL2: if NCCL fails at init, NCCL_SHM_DISABLE=1 is the usual fix"
        << (value_of(env, "NCCL_SHM_DISABLE") ? " (set now)" : " (not set now)") << ".\n";
  if (const char* p2p = value_of(env, "NCCL_P2P_DISABLE"); p2p && std::string(p2p) == "1")
    out << "  NCCL_P2P_DISABLE=1 is set now: every TP all-reduce between GPUs of this host goes through host memory.\n";
  if (const char* shm = value_of(env, "NCCL_SHM_DISABLE"); shm && std::string(shm) == "1" && !wsl)
    out << "  NCCL_SHM_DISABLE=1 is set now but this is not WSL2: ranks of one host talk over sockets.\n";
  return out.str();
}

}  // namespace shardlm::backend
