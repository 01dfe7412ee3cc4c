// The doctor report's text from hand-made device data, and its advice.
#include <gtest/gtest.h>

#include "backend/device/gpu_report.h"

namespace shardlm::backend {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(GpuReport, NcclEnvironmentPicksNcclAndCudaVisibleDevices) {
  auto env = nccl_environment({"PATH=/bin", "NCCL_SOCKET_IFNAME=eth0", "CUDA_VISIBLE_DEVICES=0,1", "NCCL_DEBUG=WARN",
                               "MY_NCCL_X=1", "garbage"});
  ASSERT_EQ(env.size(), 3u);
  EXPECT_EQ(env[0].first, "CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(env[1], (std::pair<std::string, std::string>{"NCCL_DEBUG", "WARN"}));
  EXPECT_EQ(env[2].second, "eth0");
}

TEST(GpuReport, Versions) {
  EXPECT_EQ(cuda_version_text(13000), "13.0");
  EXPECT_EQ(cuda_version_text(12080), "12.8");
  EXPECT_EQ(nccl_version_text(22703), "2.27.3");
  EXPECT_EQ(nccl_version_text(2708), "2.7.8");
  EXPECT_EQ(nccl_version_text(0), "unknown");
  EXPECT_TRUE(is_wsl("Linux version 5.15.153.1-microsoft-standard-WSL2"));
  EXPECT_FALSE(is_wsl("Linux version 6.1.0-13-amd64 (debian-kernel@lists.debian.org)"));
}

TEST(GpuReport, WithoutCudaSaysSoAndStillExplainsRemedies) {
  const std::string text = format_gpu_report(GpuReport{}, {}, false);
  EXPECT_TRUE(has(text, "built without CUDA")) << text;
  EXPECT_TRUE(has(text, "(none set"));
  EXPECT_TRUE(has(text, "NCCL_P2P_DISABLE=1"));
  EXPECT_TRUE(has(text, "NCCL_SOCKET_IFNAME="));
  EXPECT_TRUE(has(text, "NCCL_SHM_DISABLE=1"));
  EXPECT_FALSE(has(text, "runs WSL2"));
}

TEST(GpuReport, DevicesPeerMatrixNumaAndCurrentSettings) {
  GpuReport r;
  r.built_with_cuda = true;
  r.driver_version = 13000;
  r.runtime_version = 13000;
  r.nccl_version = 22703;
  for (int i = 0; i < 3; ++i)
    r.devices.push_back({.index = i, .name = "NVIDIA A100-SXM4-80GB", .pci_bus_id = "0000:0" + std::to_string(i) + ":00.0",
                         .cc_major = 8, .cc_minor = 0, .n_sms = 108, .total_bytes = uint64_t{80} << 30,
                         .free_bytes = uint64_t{79} << 30, .numa_node = i / 2, .local_cpus = i < 2 ? "0-31" : ""});
  r.peer_access = {{0, 1, 0}, {1, 0, 0}, {0, 0, 0}};
  r.peer_rank = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
  const std::string text = format_gpu_report(r, {{"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "1"}}, true);
  EXPECT_TRUE(has(text, "CUDA driver 13.0, runtime 13.0, NCCL 2.27.3")) << text;
  EXPECT_TRUE(has(text, "GPU1  NVIDIA A100-SXM4-80GB  sm_80, 108 SMs, 80.0 GiB total, 79.0 GiB free, PCI 0000:01:00.0"));
  EXPECT_TRUE(has(text, "GPU2  NUMA node 1, CPUs unknown"));
  EXPECT_TRUE(has(text, "  GPU0     X    Y0     -\n"));
  EXPECT_TRUE(has(text, "Some pairs have no P2P"));
  EXPECT_TRUE(has(text, "NCCL_P2P_DISABLE=1 is set now"));
  EXPECT_TRUE(has(text, "runs WSL2: if NCCL fails at init, NCCL_SHM_DISABLE=1 is the usual fix (set now)"));
}

TEST(GpuReport, CudaBuildWithoutDevicesSaysWhy) {
  GpuReport r;
  r.built_with_cuda = true;
  r.unavailable = "no CUDA driver (cudaErrorInsufficientDriver)";
  const std::string text = format_gpu_report(r, {}, false);
  EXPECT_TRUE(has(text, "GPUs: none usable: no CUDA driver")) << text;
}

}  // namespace
}  // namespace shardlm::backend
