#include "comm/local_comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>

#include "core/error.h"

namespace shardlm {
namespace {

class LocalCommTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommTest, AllReduceSumsOverRanks) {
  const int n = GetParam();
  run_local_ranks(n, [&](Communicator& comm) {
    std::vector<float> v(1001);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((comm.rank() + 1) * i);
    comm.all_reduce_sum(v.data(), v.size());
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(n * (n + 1) / 2 * i));
  });
}

TEST_P(LocalCommTest, AllGatherConcatenatesUnevenParts) {
  const int n = GetParam();
  run_local_ranks(n, [&](Communicator& comm) {
    std::vector<size_t> counts(n);
    for (int k = 0; k < n; ++k) counts[k] = static_cast<size_t>(3 + (k % 2));
    std::vector<float> mine(counts[comm.rank()], static_cast<float>(comm.rank()));
    std::vector<float> all(std::accumulate(counts.begin(), counts.end(), size_t{0}));
    comm.all_gather(mine.data(), all.data(), counts);
    size_t off = 0;
    for (int k = 0; k < n; ++k)
      for (size_t j = 0; j < counts[k]; ++j) ASSERT_EQ(all[off++], static_cast<float>(k));
  });
}

TEST_P(LocalCommTest, Bf16AllReduceSumsInF32AndRoundsOnce) {
  const int n = GetParam();
  run_local_ranks(n, [&](Communicator& comm) {
    // 1 + n × 2^-9: each bf16 partial sum would round 1 + 2^-9 back to 1.
    std::vector<uint16_t> v(257);
    for (size_t i = 0; i < v.size(); ++i) v[i] = f32_to_bf16(comm.rank() == 0 ? 1.0f : 0.001953125f);
    comm.all_reduce_sum(v.data(), v.size(), DType::kBF16);
    const float want = bf16_to_f32(f32_to_bf16(1.0f + static_cast<float>(n - 1) * 0.001953125f));
    for (uint16_t x : v) ASSERT_EQ(bf16_to_f32(x), want);
    // And a bf16 gather moves 2-byte elements.
    std::vector<uint16_t> mine(2, f32_to_bf16(static_cast<float>(comm.rank())));
    std::vector<uint16_t> all(2 * static_cast<size_t>(n));
    comm.all_gather(mine.data(), all.data(), std::vector<size_t>(static_cast<size_t>(n), 2), DType::kBF16);
    for (int k = 0; k < n; ++k) ASSERT_EQ(bf16_to_f32(all[2 * static_cast<size_t>(k) + 1]), static_cast<float>(k));
  });
}

TEST_P(LocalCommTest, BroadcastSendRecvAndSplit) {
  const int n = GetParam();
  run_local_ranks(n, [&](Communicator& comm) {
    int value = comm.rank() == n - 1 ? 42 : 0;
    comm.broadcast(&value, sizeof value, n - 1);
    EXPECT_EQ(value, 42);
    if (n > 1) {  // pipeline-style chain 0 -> 1 -> ... -> n-1
      float x = 0.0f;
      if (comm.rank() > 0) comm.recv(&x, sizeof x, comm.rank() - 1);
      x += 1.0f;
      if (comm.rank() < n - 1) comm.send(&x, sizeof x, comm.rank() + 1);
      EXPECT_EQ(x, static_cast<float>(comm.rank() + 1));
    }
    // Tensor-parallel groups of 2, pipeline groups across them.
    auto tp = comm.split(comm.rank() / 2, comm.rank() % 2);
    auto pp = comm.split(comm.rank() % 2, comm.rank() / 2);
    EXPECT_EQ(tp->rank(), comm.rank() % 2);
    EXPECT_EQ(pp->rank(), comm.rank() / 2);
    float one = 1.0f;
    tp->all_reduce_sum(&one, 1);
    EXPECT_EQ(one, static_cast<float>(tp->size()));
    comm.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalCommTest, ::testing::Values(1, 2, 3, 5, 6, 8));

TEST(LocalComm, AFailingRankStopsTheOthersWithItsName) {
  auto start = std::chrono::steady_clock::now();
  try {
    run_local_ranks(4, [](Communicator& comm) {
      if (comm.rank() == 2) fail(ErrorCode::kInvalidArgument, "bad shard");
      float x = 1.0f;
      comm.all_reduce_sum(&x, 1);  // ranks 0,1,3 wait here until the abort
      comm.barrier();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDistributed);
    EXPECT_NE(std::string(e.what()).find("rank 2 failed: bad shard"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// Every rank fails on its own at once: each records its failure in its own
// slot concurrently (a vector<bool> there packed the slots into one word,
// a data race the TSan pass of scripts/test.sh reports), and the error
// names the first of them.
TEST(LocalComm, RanksFailingAtOnceAreEachRecorded) {
  for (int round = 0; round < 20; ++round) {
    try {
      run_local_ranks(8, [](Communicator& comm) { fail(ErrorCode::kInvalidArgument, "bad shard ", comm.rank()); });
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDistributed);
      EXPECT_NE(std::string(e.what()).find("rank 0 failed: bad shard 0"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace shardlm
