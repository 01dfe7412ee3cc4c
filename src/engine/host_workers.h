// Threads beside the engine thread for its one parallel loop that runs
// every step (sampling the step's rows), where an OpenMP team may not be
// used: when the forward runs on this process's CPU cores, a second OpenMP
// team makes libgomp throttle the ranks' spin-waits for the life of the
// process (EngineConfig::host_threads). These are plain threads that sleep
// on a condition variable between steps; with PP = 1 the ranks' cores are
// idle while the engine samples, so the rows use them instead of one core.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace shardlm {

class HostWorkers {
 public:
  // Starts n_extra threads (0: parallel_for runs on the caller alone).
  explicit HostWorkers(int n_extra);
  ~HostWorkers();
  HostWorkers(const HostWorkers&) = delete;
  HostWorkers& operator=(const HostWorkers&) = delete;

  // body(ctx, i) for every i in [0, n), each once, on the calling thread and
  // the workers (items taken one at a time from a shared counter); returns
  // when every item is done. body must not throw. A function pointer and a
  // context, not std::function: no heap allocation per step.
  using Body = void (*)(void* ctx, int64_t i);
  void parallel_for(int64_t n, Body body, void* ctx);

  int n_threads() const { return static_cast<int>(threads_.size()) + 1; }

 private:
  void work();
  void run_items();

  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  Body body_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;  // one per parallel_for: a worker runs each once
  int busy_ = 0;             // workers still inside this generation
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace shardlm
