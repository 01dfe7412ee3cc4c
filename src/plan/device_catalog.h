// Devices plan can lay a model over: a catalog of accelerators with their
// memory, memory bandwidth and links, and the --gpus syntax that picks them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

struct DeviceSpec {
  std::string name;                   // "A100-40GB"
  int64_t memory_bytes = 0;           // what the driver reports as total (nvidia-smi memory.total)
  double memory_bandwidth = 0;        // bytes/s, spec sheet
  double link_bandwidth = 0;          // bytes/s per direction to a peer in the same host
  std::string link_name;              // "NVLink 3 (300 GB/s per direction)"
  bool assumed = false;               // bandwidths are defaults, not from a spec sheet (COUNTxMEMORY)
};

const std::vector<DeviceSpec>& device_catalog();
// Case-insensitive, ignores '-' and '_' ("a100-40gb", "A100_40GB", "h100").
// nullptr when unknown.
const DeviceSpec* find_device(const std::string& name);
// "A100-40GB, A100-80GB, ..."
std::string device_catalog_names();

// Default link between hosts: 100 Gb/s (InfiniBand EDR / 100 GbE) = 12.5 GB/s.
constexpr double kDefaultInterNodeBandwidth = 12.5e9;

// The devices of a run, in rank order: rank r of a layout lands on devices[r].
struct DeviceInventory {
  std::vector<DeviceSpec> devices;  // one entry per device
  int n_nodes = 1;                  // devices are split evenly over the hosts, in order
  double inter_node_bandwidth = kDefaultInterNodeBandwidth;  // bytes/s per direction
  int n_devices() const { return static_cast<int>(devices.size()); }
  int devices_per_node() const { return n_devices() / n_nodes; }
  int node_of(int device) const { return device / devices_per_node(); }
  // "6x A100-40GB" / "2x A100-80GB + 2x A100-40GB"
  std::string describe() const;
};

// Parses --gpus: comma-separated groups COUNTxNAME (catalog) or COUNTxMEMORY
// ("24GiB", "80GB", "16000MiB"). `n_nodes` must divide the device count.
// Throws Error(kInvalidArgument) naming the group and listing the catalog.
DeviceInventory parse_device_inventory(const std::string& text, int n_nodes = 1,
                                       double inter_node_bandwidth = kDefaultInterNodeBandwidth);

nlohmann::json device_json(const DeviceSpec& device);

}  // namespace shardlm
