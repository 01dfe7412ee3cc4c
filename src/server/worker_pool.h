// The HTTP servers' task queue: one thread per open connection (cpp-httplib
// serves a connection on one thread for its whole life), started when a
// connection arrives and no thread is idle, up to a maximum. httplib's own
// ThreadPool starts its maximum up front; sizing that for 1,000 streams would
// hold 1,000 idle threads in a server that sees ten clients. Threads idle
// for `idle_exit` exit, so a burst's threads do not stay forever.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <httplib.h>

namespace shardlm::server {

class WorkerPool final : public httplib::TaskQueue {
 public:
  explicit WorkerPool(size_t max_threads, std::chrono::milliseconds idle_exit = std::chrono::seconds(30));
  ~WorkerPool() override;

  // Runs fn on an idle thread, or a new one when none is idle and fewer
  // than max_threads run; otherwise it waits for the next thread to free.
  void enqueue(std::function<void()> fn) override;
  // Runs the queued tasks to their end, then joins every thread.
  void shutdown() override;

  size_t n_threads() const;       // alive now
  size_t peak_threads() const;    // most alive at once

 private:
  void work();

  const size_t max_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::unordered_map<std::thread::id, std::thread> threads_;
  std::vector<std::thread> exited_;  // joined by the next enqueue or shutdown
  size_t n_idle_ = 0;
  size_t peak_ = 0;
  bool shutdown_ = false;
};

}  // namespace shardlm::server
