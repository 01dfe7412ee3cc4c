#include "plan/device_catalog.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/units.h"

namespace shardlm {

namespace {

constexpr int64_t kMiB = 1024LL * 1024LL;

// Memory: the total the driver reports (nvidia-smi --query-gpu=memory.total,
// in MiB; the same figure cudaMemGetInfo and torch report), not the marketing
// "40GB": an A100 "40GB" exposes 40,536 MiB = 39.59 GiB = 42.51 GB. This is
// what vLLM multiplies by --gpu-memory-utilization.
// Bandwidths: vendor spec sheets, decimal units (1 GB/s = 1e9 B/s). Links are
// per direction: NVLink totals on the sheets count both directions.
constexpr double kGBs = 1e9;
const std::vector<DeviceSpec> kCatalog = {
    // A100 SXM4 40GB: 1,555 GB/s HBM2; NVLink 3 600 GB/s bidirectional
    // (NVIDIA A100 datasheet). nvidia-smi: 40,536 MiB.
    {"A100-40GB", 40536 * kMiB, 1555 * kGBs, 300 * kGBs, "NVLink 3 (600 GB/s bidirectional)", false},
    // A100 SXM4 80GB: 2,039 GB/s HBM2e; NVLink 3. nvidia-smi: 81,251 MiB.
    {"A100-80GB", 81251 * kMiB, 2039 * kGBs, 300 * kGBs, "NVLink 3 (600 GB/s bidirectional)", false},
    // H100 SXM5 80GB: 3.35 TB/s HBM3; NVLink 4 900 GB/s bidirectional
    // (NVIDIA H100 datasheet). nvidia-smi: 81,559 MiB.
    {"H100-80GB", 81559 * kMiB, 3350 * kGBs, 450 * kGBs, "NVLink 4 (900 GB/s bidirectional)", false},
    // H100 PCIe 80GB: 2.0 TB/s HBM2e; PCIe Gen5 x16 128 GB/s bidirectional
    // (no NVLink bridge assumed). nvidia-smi: 81,559 MiB.
    {"H100-PCIe", 81559 * kMiB, 2000 * kGBs, 64 * kGBs, "PCIe Gen5 x16 (64 GB/s per direction)", false},
    // H200 SXM 141GB: 4.8 TB/s HBM3e; NVLink 4 900 GB/s (NVIDIA H200 datasheet).
    // nvidia-smi: 143,771 MiB.
    {"H200", 143771 * kMiB, 4800 * kGBs, 450 * kGBs, "NVLink 4 (900 GB/s bidirectional)", false},
    // L40S 48GB GDDR6: 864 GB/s; PCIe Gen4 x16 64 GB/s bidirectional, no NVLink.
    // nvidia-smi: 46,068 MiB.
    {"L40S", 46068 * kMiB, 864 * kGBs, 32 * kGBs, "PCIe Gen4 x16 (32 GB/s per direction)", false},
    // GeForce RTX 4090 24GB GDDR6X: 1,008 GB/s; PCIe Gen4 x16, no NVLink and
    // no peer-to-peer (collectives go through host memory). nvidia-smi: 24,564 MiB.
    {"RTX-4090", 24564 * kMiB, 1008 * kGBs, 25 * kGBs, "PCIe Gen4 x16, no P2P (~25 GB/s through host)", false},
    // GeForce RTX 3090 24GB GDDR6X: 936 GB/s; PCIe Gen4 x16 (NVLink bridge
    // optional, not assumed). nvidia-smi: 24,576 MiB.
    {"RTX-3090", 24576 * kMiB, 936 * kGBs, 32 * kGBs, "PCIe Gen4 x16 (32 GB/s per direction)", false},
    // A10 24GB GDDR6: 600 GB/s; PCIe Gen4 x16. nvidia-smi: 23,028 MiB.
    {"A10", 23028 * kMiB, 600 * kGBs, 32 * kGBs, "PCIe Gen4 x16 (32 GB/s per direction)", false},
    // L4 24GB GDDR6: 300 GB/s; PCIe Gen4 x16. nvidia-smi: 23,034 MiB.
    {"L4", 23034 * kMiB, 300 * kGBs, 32 * kGBs, "PCIe Gen4 x16 (32 GB/s per direction)", false},
    // T4 16GB GDDR6: 320 GB/s; PCIe Gen3 x16 32 GB/s bidirectional. nvidia-smi: 15,360 MiB.
    {"T4", 15360 * kMiB, 320 * kGBs, 16 * kGBs, "PCIe Gen3 x16 (16 GB/s per direction)", false},
    // RTX A6000 48GB GDDR6: 768 GB/s; PCIe Gen4 x16 (NVLink bridge 112.5 GB/s
    // optional, not assumed). nvidia-smi: 49,140 MiB.
    {"A6000", 49140 * kMiB, 768 * kGBs, 32 * kGBs, "PCIe Gen4 x16 (32 GB/s per direction)", false},
    // AMD Instinct MI300X 192GB HBM3: 5.3 TB/s; Infinity Fabric 7 links × 64 GB/s
    // per direction (AMD MI300X datasheet). rocm-smi: 196,592 MiB (VRAM total).
    {"MI300X", 196592 * kMiB, 5300 * kGBs, 448 * kGBs, "Infinity Fabric (7 × 64 GB/s per direction)", false},
};

std::string canonical(const std::string& s) {
  std::string out;
  for (unsigned char c : s)
    if (c != '-' && c != '_' && c != ' ') out += static_cast<char>(std::toupper(c));
  return out;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// "24GiB" / "80GB" / "16000MiB" / "24G" -> bytes; false when not a memory size.
bool parse_memory(const std::string& text, int64_t* bytes) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0 || i == text.size()) return false;
  double value = 0;
  try {
    value = std::stod(text.substr(0, i));
  } catch (...) {
    return false;
  }
  std::string unit = canonical(text.substr(i));
  static const std::map<std::string, double> units = {
      {"GIB", kGiB}, {"GB", kGB}, {"MIB", 1024.0 * 1024.0}, {"MB", 1e6}, {"TIB", kGiB * 1024.0}, {"TB", 1e12}};
  auto it = units.find(unit);
  if (it == units.end()) return false;
  *bytes = static_cast<int64_t>(std::llround(value * it->second));
  return *bytes > 0;
}

}  // namespace

const std::vector<DeviceSpec>& device_catalog() { return kCatalog; }

const DeviceSpec* find_device(const std::string& name) {
  const std::string key = canonical(name);
  for (const auto& d : kCatalog)
    if (canonical(d.name) == key) return &d;
  // Common aliases.
  static const std::map<std::string, std::string> aliases = {
      {"A10040G", "A100-40GB"}, {"A100", "A100-40GB"},   {"A10080G", "A100-80GB"}, {"H100", "H100-80GB"},
      {"H100SXM", "H100-80GB"}, {"H100PCIE80GB", "H100-PCIe"}, {"4090", "RTX-4090"}, {"3090", "RTX-3090"},
      {"RTXA6000", "A6000"},    {"H200141GB", "H200"},    {"L40S48GB", "L40S"}};
  auto it = aliases.find(key);
  if (it != aliases.end()) return find_device(it->second);
  return nullptr;
}

std::string device_catalog_names() {
  std::string out;
  for (const auto& d : kCatalog) out += (out.empty() ? "" : ", ") + d.name;
  return out;
}

std::string DeviceInventory::describe() const {
  std::string out;
  size_t i = 0;
  while (i < devices.size()) {
    size_t j = i;
    while (j < devices.size() && devices[j].name == devices[i].name) ++j;
    out += str_cat(out.empty() ? "" : " + ", j - i, "x ", devices[i].name);
    i = j;
  }
  if (n_nodes > 1) out += str_cat(" over ", n_nodes, " hosts");
  return out;
}

DeviceInventory parse_device_inventory(const std::string& text, int n_nodes, double inter_node_bandwidth) {
  DeviceInventory inv;
  size_t start = 0;
  const std::string usage =
      " (expected COUNTxNAME or COUNTxMEMORY groups separated by commas, e.g. 6xA100-40GB, 4x24GiB, "
      "2xA100-80GB,2xA100-40GB; catalog: " + device_catalog_names() + ")";
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string group = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? text.size() + 1 : comma + 1;
    size_t x = group.find_first_of("xX");
    if (group.empty() || x == std::string::npos || x == 0)
      fail(ErrorCode::kInvalidArgument, "--gpus: group \"", group, "\" has no COUNTx prefix", usage);
    int count = 0;
    for (size_t i = 0; i < x; ++i) {
      if (!std::isdigit(static_cast<unsigned char>(group[i])))
        fail(ErrorCode::kInvalidArgument, "--gpus: count \"", group.substr(0, x), "\" in \"", group, "\" is not a number", usage);
      count = count * 10 + (group[i] - '0');
      if (count > 4096) fail(ErrorCode::kInvalidArgument, "--gpus: count in \"", group, "\" is over 4096 devices");
    }
    if (count < 1) fail(ErrorCode::kInvalidArgument, "--gpus: group \"", group, "\" has no devices");
    const std::string what = trim(group.substr(x + 1));
    DeviceSpec device;
    int64_t bytes = 0;
    if (const DeviceSpec* d = find_device(what)) {
      device = *d;
    } else if (parse_memory(what, &bytes)) {
      // A device known only by its memory: bandwidths are assumptions, said so in the plan.
      device.name = what;
      device.memory_bytes = bytes;
      device.memory_bandwidth = 1000 * kGBs;
      device.link_bandwidth = 32 * kGBs;
      device.link_name = "PCIe Gen4 x16 (assumed)";
      device.assumed = true;
    } else {
      fail(ErrorCode::kInvalidArgument, "--gpus: unknown device \"", what, "\" in \"", group, "\"", usage);
    }
    for (int i = 0; i < count; ++i) inv.devices.push_back(device);
  }
  if (n_nodes < 1) fail(ErrorCode::kInvalidArgument, "--nodes ", n_nodes, ": must be at least 1");
  if (inv.n_devices() % n_nodes != 0)
    fail(ErrorCode::kInvalidArgument, "--nodes ", n_nodes, " does not divide the ", inv.n_devices(),
         " devices of --gpus ", text, ": devices are split evenly over the hosts; give a count that is a multiple of ",
         n_nodes);
  if (!(inter_node_bandwidth > 0))
    fail(ErrorCode::kInvalidArgument, "--inter-node-bandwidth must be positive (Gb/s)");
  inv.n_nodes = n_nodes;
  inv.inter_node_bandwidth = inter_node_bandwidth;
  return inv;
}

nlohmann::json device_json(const DeviceSpec& d) {
  return {{"name", d.name},
          {"memory_bytes", d.memory_bytes},
          {"memory_gib", d.memory_bytes / kGiB},
          {"memory_bandwidth_gb_per_s", d.memory_bandwidth / kGB},
          {"link_bandwidth_gb_per_s", d.link_bandwidth / kGB},
          {"link", d.link_name},
          {"bandwidth_assumed", d.assumed}};
}

}  // namespace shardlm
