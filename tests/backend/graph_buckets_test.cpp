// CUDA graph bookkeeping on CPU: bucket choice and the capture/replay state
// machine, driven through a fake runner that records every call.
#include <gtest/gtest.h>

#include <stdexcept>

#include "backend/device/graph_buckets.h"
#include "core/error.h"

namespace shardlm::backend {
namespace {

TEST(GraphBuckets, DefaultBucketsFollowVllm) {
  EXPECT_EQ(default_graph_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(default_graph_buckets(3), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(default_graph_buckets(8), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(default_graph_buckets(30), (std::vector<int>{1, 2, 4, 8, 16, 24, 30}));
  EXPECT_EQ(default_graph_buckets(64).size(), 11u);  // 1 2 4 8 16 24 32 40 48 56 64
  EXPECT_THROW(default_graph_buckets(0), Error);
}

TEST(GraphBuckets, ChoosesSmallestBucketThatFits) {
  const std::vector<int> b = default_graph_buckets(64);
  EXPECT_EQ(choose_graph_bucket(b, 1), 1);
  EXPECT_EQ(choose_graph_bucket(b, 3), 4);
  EXPECT_EQ(choose_graph_bucket(b, 9), 16);
  EXPECT_EQ(choose_graph_bucket(b, 64), 64);
  EXPECT_EQ(choose_graph_bucket(b, 65), -1);
  EXPECT_EQ(choose_graph_bucket(b, 0), -1);
}

struct FakeRunner : GraphStepRunner {
  std::vector<std::string> calls;
  bool capturing = false;
  int fail_capture_of = -1;
  void run_eager(int n) override { calls.push_back((capturing ? "record " : "eager ") + std::to_string(n)); }
  void begin_capture(int b) override {
    capturing = true;
    calls.push_back("begin " + std::to_string(b));
  }
  void end_capture(int b) override {
    capturing = false;
    calls.push_back("end " + std::to_string(b));
    if (b == fail_capture_of) throw std::runtime_error("operation not permitted when stream is capturing");
  }
  void abandon_capture(int b) noexcept override {
    capturing = false;
    calls.push_back("abandon " + std::to_string(b));
  }
  void replay(int b) override { calls.push_back("replay " + std::to_string(b)); }
};

TEST(DecodeGraphCache, WarmsUpThenCapturesOnceThenReplays) {
  DecodeGraphCache cache({1, 2, 4, 8}, /*warmup_steps=*/1);
  FakeRunner r;
  EXPECT_EQ(cache.step(3, r), GraphAction::kEager);  // warm-up, padded to the bucket
  EXPECT_EQ(cache.state(4), GraphState::kEmpty);
  EXPECT_EQ(cache.step(4, r), GraphAction::kCaptureThenReplay);
  EXPECT_EQ(cache.state(4), GraphState::kReady);
  EXPECT_EQ(cache.step(3, r), GraphAction::kReplay);
  EXPECT_EQ(cache.step(9, r), GraphAction::kEager);  // larger than every bucket
  EXPECT_EQ(r.calls, (std::vector<std::string>{"eager 4", "begin 4", "record 4", "end 4", "replay 4", "replay 4",
                                               "eager 9"}));
  EXPECT_EQ(cache.n_captures(), 1);
  EXPECT_EQ(cache.n_replays(), 2);
  EXPECT_EQ(cache.n_eager(), 2);
  EXPECT_EQ(cache.state(1), GraphState::kEmpty);  // other buckets untouched
}

TEST(DecodeGraphCache, FailedCaptureRunsTheStepAndStaysEagerWithItsReason) {
  DecodeGraphCache cache({1, 2}, /*warmup_steps=*/0);
  FakeRunner r;
  r.fail_capture_of = 2;
  EXPECT_EQ(cache.step(2, r), GraphAction::kEager);
  EXPECT_EQ(cache.state(2), GraphState::kFailed);
  EXPECT_NE(cache.failure(2).find("stream is capturing"), std::string::npos);
  EXPECT_EQ(cache.step(2, r), GraphAction::kEager);  // never retried until invalidate()
  EXPECT_EQ(r.calls, (std::vector<std::string>{"begin 2", "record 2", "end 2", "abandon 2", "eager 2", "eager 2"}));
  EXPECT_EQ(cache.step(1, r), GraphAction::kCaptureThenReplay);  // bucket 1 is fine
}

TEST(DecodeGraphCache, InvalidateForgetsEveryGraph) {
  DecodeGraphCache cache({1}, 0);
  FakeRunner r;
  cache.step(1, r);
  EXPECT_EQ(cache.state(1), GraphState::kReady);
  cache.invalidate();  // the KV pool moved: baked-in pointers are stale
  EXPECT_EQ(cache.state(1), GraphState::kEmpty);
  EXPECT_EQ(cache.plan(1), GraphAction::kCaptureThenReplay);
  EXPECT_EQ(cache.n_captures(), 1);
}

TEST(DecodeGraphCache, RefusesBadBuckets) {
  EXPECT_THROW(DecodeGraphCache({2, 1}), Error);
  EXPECT_THROW(DecodeGraphCache({0, 1}), Error);
  EXPECT_THROW(DecodeGraphCache({1}, -1), Error);
  DecodeGraphCache ok({1, 4});
  EXPECT_THROW(ok.state(3), Error);
}

}  // namespace
}  // namespace shardlm::backend
