#include "server/worker_pool.h"

#include <algorithm>

namespace shardlm::server {

WorkerPool::WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit)
    : max_threads_(std::max<size_t>(1, max_threads)), idle_exit_(idle_exit) {}

WorkerPool::~WorkerPool() { shutdown(); }

void WorkerPool::enqueue(std::function<void()> fn) {
  std::vector<std::thread> exited;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exited.swap(exited_);
    jobs_.push_back(std::move(fn));
    // Jobs already queued are waiting for the idle threads too.
    if (!shutdown_ && n_idle_ < jobs_.size() && threads_.size() < max_threads_) {
      std::thread t([this] { work(); });
      const auto id = t.get_id();
      threads_.emplace(id, std::move(t));
      peak_ = std::max(peak_, threads_.size());
    }
  }
  cv_.notify_one();
  for (auto& t : exited) t.join();
}

void WorkerPool::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++n_idle_;
    const bool woke = cv_.wait_for(lock, idle_exit_, [&] { return !jobs_.empty() || shutdown_; });
    --n_idle_;
    if (jobs_.empty() && (shutdown_ || !woke)) break;
    if (jobs_.empty()) continue;
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    fn();
    fn = nullptr;
    lock.lock();
  }
  // Leave: hand our std::thread to someone who can join it.
  if (!shutdown_) {
    auto it = threads_.find(std::this_thread::get_id());
    if (it != threads_.end()) {
      exited_.push_back(std::move(it->second));
      threads_.erase(it);
    }
  }
}

void WorkerPool::shutdown() {
  std::unordered_map<std::thread::id, std::thread> threads;
  std::vector<std::thread> exited;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
  }
  cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    threads.swap(threads_);
    exited.swap(exited_);
  }
  for (auto& [id, t] : threads) t.join();
  for (auto& t : exited) t.join();
}

size_t WorkerPool::n_threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return threads_.size();
}

size_t WorkerPool::peak_threads() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

}  // namespace shardlm::server
