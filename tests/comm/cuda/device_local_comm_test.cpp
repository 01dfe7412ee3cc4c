// DeviceLocalComm: ranks as threads sharing one GPU (skips without a GPU;
// scripts/gpu-check.sh runs it). Collectives with uneven counts, a ring of
// sends, split, and a rank that never arrives becoming a named timeout.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "comm/cuda/device_local_comm.h"
#include "core/error.h"

namespace shardlm {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

void on_ranks(int n, const std::function<void(DeviceLocalComm&)>& body) {
  auto group = DeviceLocalGroup::create(n, 0);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        cudaSetDevice(0);
        auto comm = group->make(r);
        body(*comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<float> fetch(const float* d, size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  cudaMemcpyAsync(h.data(), d, n * 4, cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  return h;
}

TEST(DeviceLocalComm, AllReduceAllGatherAndRingForTp2346) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  for (int n : {2, 3, 4, 6}) {
    on_ranks(n, [n](DeviceLocalComm& c) {
      const size_t count = 1001;  // not a multiple of any n
      std::vector<float> h(count);
      for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>(c.rank() + 1) * static_cast<float>(i % 7);
      float* d = nullptr;
      cudaMalloc(&d, count * 4);
      cudaMemcpyAsync(d, h.data(), count * 4, cudaMemcpyHostToDevice, c.stream());
      c.all_reduce_sum(d, count);
      auto got = fetch(d, count, c.stream());
      const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[i], ranks_sum * static_cast<float>(i % 7)) << i;

      std::vector<size_t> counts;
      for (int r = 0; r < n; ++r) counts.push_back(static_cast<size_t>(r + 1));  // uneven shards
      float* out = nullptr;
      cudaMalloc(&out, n * (n + 1) / 2 * 4);
      std::vector<float> mine(c.rank() + 1, static_cast<float>(c.rank()));
      cudaMemcpyAsync(d, mine.data(), mine.size() * 4, cudaMemcpyHostToDevice, c.stream());
      c.all_gather(d, out, counts);
      auto all = fetch(out, n * (n + 1) / 2, c.stream());
      size_t k = 0;
      for (int r = 0; r < n; ++r)
        for (int j = 0; j <= r; ++j) ASSERT_EQ(all[k++], static_cast<float>(r));

      // Ring: every rank sends first, then receives.
      const float v = 10.0f + c.rank();
      cudaMemcpyAsync(d, &v, 4, cudaMemcpyHostToDevice, c.stream());
      c.send(d, 4, (c.rank() + 1) % n);
      c.recv(out, 4, (c.rank() + n - 1) % n);
      ASSERT_EQ(fetch(out, 1, c.stream())[0], 10.0f + static_cast<float>((c.rank() + n - 1) % n));
      c.barrier();
      cudaFree(d);
      cudaFree(out);
    });
  }
}

TEST(DeviceLocalComm, SplitMakesGroupsByColor) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  on_ranks(4, [](DeviceLocalComm& c) {
    auto sub = c.split(c.rank() % 2, c.rank());
    ASSERT_EQ(sub->size(), 2);
    ASSERT_EQ(sub->rank(), c.rank() / 2);
  });
}

TEST(DeviceLocalComm, MissingRankTimesOutNamingRankAndOperation) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  setenv("SHARDLM_COLLECTIVE_TIMEOUT_S", "0.3", 1);
  auto group = DeviceLocalGroup::create(2, 0);
  unsetenv("SHARDLM_COLLECTIVE_TIMEOUT_S");
  auto c0 = group->make(0);
  float* d = nullptr;
  cudaMalloc(&d, 16);
  try {
    c0->all_reduce_sum(d, 4);  // rank 1 never calls it
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDistributed);
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2: all_reduce_sum(f32, 4 elements) did not complete within 0.3 s"),
              std::string::npos)
        << e.what();
  }
  cudaFree(d);
}

}  // namespace
}  // namespace shardlm
