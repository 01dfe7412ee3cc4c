// The NCCL error paths on CPU: a fake probe stands in for a stream and a
// communicator that finish, fail asynchronously, or never finish.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

#include "comm/collective_watchdog.h"
#include "core/error.h"

namespace shardlm {
namespace {

struct FakeProbe : CollectiveProbe {
  int polls_until_done = -1;  // -1: never
  int fail_after = -1;        // poll count at which the communicator reports an error
  bool throw_instead = false;
  int n_polls = 0;
  int n_aborts = 0;
  CollectivePollResult poll(std::string* error) override {
    ++n_polls;
    if (fail_after >= 0 && n_polls > fail_after) {
      if (throw_instead) throw std::runtime_error("cudaErrorLaunchFailure: unspecified launch failure");
      *error = "remote process exited or there was a network error (ncclRemoteError)";
      return CollectivePollResult::kFailed;
    }
    if (polls_until_done >= 0 && n_polls >= polls_until_done) return CollectivePollResult::kDone;
    return CollectivePollResult::kPending;
  }
  void abort() noexcept override { ++n_aborts; }
};

const CollectiveOp kOp{.rank = 3, .world_size = 6, .what = "all_reduce_sum(bf16, 4096 elements)"};

TEST(CollectiveWatchdog, ReturnsWhenDone) {
  FakeProbe p;
  p.polls_until_done = 5;
  wait_for_collective(p, kOp, std::chrono::milliseconds(5000));
  EXPECT_EQ(p.n_polls, 5);
  EXPECT_EQ(p.n_aborts, 0);
}

TEST(CollectiveWatchdog, AsyncErrorNamesRankAndOperationAndAborts) {
  FakeProbe p;
  p.fail_after = 2;
  try {
    wait_for_collective(p, kOp, std::chrono::milliseconds(5000));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDistributed);
    EXPECT_NE(std::string(e.what()).find("rank 3 of 6: all_reduce_sum(bf16, 4096 elements) failed: remote process "
                                         "exited"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(p.n_aborts, 1);
}

TEST(CollectiveWatchdog, ProbeThatThrowsBecomesADistributedError) {
  FakeProbe p;
  p.fail_after = 0;
  p.throw_instead = true;
  try {
    wait_for_collective(p, kOp, std::chrono::milliseconds(5000));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDistributed);
    EXPECT_NE(std::string(e.what()).find("rank 3 of 6: all_reduce_sum(bf16, 4096 elements) failed: cudaErrorLaunch"),
              std::string::npos);
  }
  EXPECT_EQ(p.n_aborts, 1);
}

TEST(CollectiveWatchdog, HangBecomesATimeoutErrorInsteadOfWaitingForever) {
  FakeProbe p;  // never finishes
  const auto t0 = std::chrono::steady_clock::now();
  try {
    wait_for_collective(p, {.rank = 1, .world_size = 2, .what = "recv(4096 bytes from rank 0)"},
                        std::chrono::milliseconds(100));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2: recv(4096 bytes from rank 0) did not complete within 0.1 s"),
              std::string::npos)
        << e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(waited, 0.1);
  EXPECT_LT(waited, 2.0);
  EXPECT_EQ(p.n_aborts, 1);
  EXPECT_LT(p.n_polls, 5000);  // it backed off instead of spinning
}

TEST(CollectiveWatchdog, TimeoutFromEnvironment) {
  unsetenv("SHARDLM_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(collective_timeout_from_env().count(), 300000);
  setenv("SHARDLM_COLLECTIVE_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(collective_timeout_from_env().count(), 2500);
  for (const char* bad : {"abc", "-1", "0", "5s"}) {
    setenv("SHARDLM_COLLECTIVE_TIMEOUT_S", bad, 1);
    EXPECT_THROW(collective_timeout_from_env(), Error) << bad;
  }
  unsetenv("SHARDLM_COLLECTIVE_TIMEOUT_S");
}

}  // namespace
}  // namespace shardlm
