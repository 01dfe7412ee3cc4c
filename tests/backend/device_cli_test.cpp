// --device on the commands that run the model, as a user types it: a bad
// value names the flag; cuda in a build without CUDA names the build flag,
// and with CUDA but no GPU says so. Every refusal exits non-zero.
#include <gtest/gtest.h>

#include "support/process.h"

namespace shardlm {
namespace {

std::string cli() { return testing::shell_quote(testing::env_or("SHARDLM_CLI", "shardlm")); }

TEST(DeviceCli, ABadDeviceIsRefusedNamingTheFlag) {
  for (const char* cmd : {"generate --prompt-ids 1,2,3 --max-tokens 2", "serve --port 1"}) {
    const auto r = testing::run_command(cli() + " " + cmd + " --device gpu");
    EXPECT_NE(r.rc, 0) << cmd;
    EXPECT_NE(r.err.find("--device \"gpu\": use cpu, cuda"), std::string::npos) << cmd << "\n" << r.err;
  }
}

TEST(DeviceCli, CudaWithoutAUsableGpuIsRefusedWithTheReason) {
  // (serve is left out: on a GPU machine it would start serving.)
  for (const char* cmd : {"generate --prompt-ids 1,2,3 --max-tokens 2", "perplexity --max-tokens 4 " SHARDLM_TEST_TEXT}) {
    const auto r = testing::run_command(cli() + " " + cmd + " --device cuda");
    // A machine with a GPU and a CUDA build runs it instead (scripts/gpu-check.sh covers that).
    if (r.rc == 0) GTEST_SKIP() << "this machine runs --device cuda";
    const bool said = r.err.find("built without CUDA; rebuild with -DSHARDLM_CUDA=ON") != std::string::npos ||
                      r.err.find("sees no CUDA device") != std::string::npos;
    EXPECT_TRUE(said) << cmd << "\n" << r.err;
  }
}

TEST(DeviceCli, CudaGraphsOnTheCpuAreRefusedAndOffIsAccepted) {
  for (const char* cmd : {"generate --prompt-ids 1,2,3 --max-tokens 2", "generate --decode-bench 1 --tp 1",
                          "serve --port 1"}) {
    const auto r = testing::run_command(cli() + " " + cmd + " --cuda-graphs on");
    EXPECT_NE(r.rc, 0) << cmd;
    EXPECT_NE(r.err.find("--cuda-graphs on needs a GPU (--device cuda)"), std::string::npos) << cmd << "\n" << r.err;
  }
  const auto bad = testing::run_command(cli() + " generate --prompt-ids 1,2,3 --cuda-graphs maybe");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.err.find("--cuda-graphs"), std::string::npos) << bad.err;
  const auto off = testing::run_command(cli() + " generate --prompt-ids 1,2,3 --max-tokens 2 --cuda-graphs off --json");
  EXPECT_EQ(off.rc, 0) << off.err;
  EXPECT_EQ(off.err.find("CUDA graphs"), std::string::npos) << off.err;  // nothing to say on the CPU
}

TEST(DeviceCli, SamplingOnTheDeviceNeedsAGpu) {
  const auto r = testing::run_command(cli() + " generate --prompt-ids 1,2,3 --max-tokens 2 --sampling-device device");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("--sampling-device device needs a GPU"), std::string::npos) << r.err;
  const auto host = testing::run_command(cli() + " generate --prompt-ids 1,2,3 --max-tokens 2 --sampling-device host --json");
  EXPECT_EQ(host.rc, 0) << host.err;
}

TEST(DeviceCli, CpuIsTheDefaultAndRunsAsBefore) {
  const auto r = testing::run_command(cli() + " generate --prompt-ids 1,2,3 --max-tokens 2 --device cpu --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("\"token_ids\""), std::string::npos) << r.out;
}

}  // namespace
}  // namespace shardlm
