// engine/host_workers.h: every index runs once per call, over many calls,
// on more than one thread; the caller returns only after every worker is
// done with the call.
#include "engine/host_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace shardlm {
namespace {

TEST(HostWorkers, EveryIndexOnceOverManyCalls) {
  HostWorkers pool(2);
  EXPECT_EQ(pool.n_threads(), 3);
  for (int64_t n : {0, 1, 2, 3, 16, 1000}) {
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      auto body = [](void* ctx, int64_t i) { (*static_cast<std::vector<std::atomic<int>>*>(ctx))[size_t(i)]++; };
      pool.parallel_for(n, body, &hits);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n " << n << " index " << i;
    }
  }
}

// Item 0 waits until item 1 has started on another thread: it can only
// finish if a worker takes part. A broken pool (no worker ever runs an item)
// fails by the guard's deadline instead of hanging the suite.
TEST(HostWorkers, ItemsRunOnAWorkerBesideTheCaller) {
  HostWorkers pool(1);
  struct Ctx {
    std::mutex m;
    std::condition_variable cv;
    std::set<std::thread::id> threads;
    bool second_started = false;
    bool timed_out = false;
  } ctx;
  auto body = [](void* p, int64_t i) {
    Ctx& c = *static_cast<Ctx*>(p);
    std::unique_lock<std::mutex> lock(c.m);
    c.threads.insert(std::this_thread::get_id());
    if (i == 1) {
      c.second_started = true;
      c.cv.notify_all();
    } else if (!c.cv.wait_for(lock, std::chrono::seconds(60), [&] { return c.second_started; })) {
      c.timed_out = true;  // the failure guard only; the pass never waits on the clock
    }
  };
  pool.parallel_for(2, body, &ctx);
  EXPECT_FALSE(ctx.timed_out) << "no worker took the second item";
  EXPECT_EQ(ctx.threads.size(), 2u);
}

// parallel_for returns only after a late worker has left the call: the
// context it reads lives on the caller's stack.
TEST(HostWorkers, ReturnsOnlyAfterEveryWorkerLeftTheCall) {
  HostWorkers pool(3);
  for (int rep = 0; rep < 200; ++rep) {
    std::atomic<int> inside{0}, done{0};
    struct Ctx {
      std::atomic<int>* inside;
      std::atomic<int>* done;
    } ctx{&inside, &done};
    auto body = [](void* p, int64_t) {
      Ctx& c = *static_cast<Ctx*>(p);
      c.inside->fetch_add(1);
      c.done->fetch_add(1);
      c.inside->fetch_sub(1);
    };
    pool.parallel_for(4, body, &ctx);
    ASSERT_EQ(done.load(), 4);
    ASSERT_EQ(inside.load(), 0);
  }
}

}  // namespace
}  // namespace shardlm
