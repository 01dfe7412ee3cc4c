#include "engine/host_workers.h"

namespace shardlm {

HostWorkers::HostWorkers(int n_extra) {
  for (int t = 0; t < n_extra; ++t) threads_.emplace_back([this] { work(); });
}

HostWorkers::~HostWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void HostWorkers::run_items() {
  for (int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_;
       i = next_.fetch_add(1, std::memory_order_relaxed))
    body_(ctx_, i);
}

void HostWorkers::parallel_for(int64_t n, Body body, void* ctx) {
  if (n <= 0) return;
  if (threads_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) body(ctx, i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = body;
    ctx_ = ctx;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  run_items();
  // Every worker leaves this generation before body_ and ctx_ go out of
  // scope, even one that woke after the caller had taken every item.
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
}

void HostWorkers::work() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    run_items();
    lock.lock();
    if (--busy_ == 0) done_cv_.notify_one();
  }
}

}  // namespace shardlm
