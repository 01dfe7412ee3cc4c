// `shardlm doctor` as a user runs it: on a machine without a GPU (or a build
// without CUDA) it says so and exits 0.
#include <gtest/gtest.h>

#include "support/process.h"

namespace shardlm {
namespace {

TEST(DoctorCli, ExitsZeroAndReportsGpusAndNcclSettings) {
  const auto r = testing::run_command("NCCL_SOCKET_IFNAME=lo " + testing::shell_quote(testing::env_or("SHARDLM_CLI", "shardlm")) +
                                      " doctor");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("shardlm doctor"), std::string::npos) << r.out;
  // Either this build has no CUDA, or it found no usable GPU, or it lists devices.
  const bool said = r.out.find("built without CUDA") != std::string::npos ||
                    r.out.find("GPUs: none usable") != std::string::npos ||
                    r.out.find("Devices (") != std::string::npos;
  EXPECT_TRUE(said) << r.out;
  EXPECT_NE(r.out.find("  NCCL_SOCKET_IFNAME=lo\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("NCCL_SHM_DISABLE=1"), std::string::npos);
}

TEST(DoctorCli, RefusesUnknownFlags) {
  const auto r = testing::run_command(testing::shell_quote(testing::env_or("SHARDLM_CLI", "shardlm")) + " doctor --gpus 3",
                                      true);
  EXPECT_NE(r.rc, 0) << r.out;
}

}  // namespace
}  // namespace shardlm
