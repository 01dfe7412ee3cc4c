// A stand-in for the engine loop, shared by both servers of
// connections_bench: one thread steps every `step`; each step gives the next
// token to every running stream (at most `max_running`, admitted first come
// first served, as --max-num-seqs admits), like one batch of decodes. Both
// servers are fed by the same clock, so they differ only in how they hold
// connections. Callbacks run on the stepping thread, as the real engine's
// RequestCallbacks do.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace shardlm::bench {

class CadenceEngine {
 public:
  // token: 0, 1, ...; last: the stream's final token (or its abort).
  using TokenFn = std::function<void(int64_t token, bool last)>;

  CadenceEngine(int64_t max_running, std::chrono::microseconds step) : max_running_(max_running), step_(step) {
    thread_ = std::thread([this] { loop(); });
  }
  ~CadenceEngine() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  CadenceEngine(const CadenceEngine&) = delete;
  CadenceEngine& operator=(const CadenceEngine&) = delete;

  // Thread-safe. Returns the stream's id for cancel().
  uint64_t submit(int64_t n_tokens, TokenFn fn) {
    auto s = std::make_shared<Stream>();
    s->n_tokens = n_tokens;
    s->fn = std::move(fn);
    std::lock_guard<std::mutex> lock(mutex_);
    s->id = next_id_++;
    waiting_.push_back(s);
    by_id_[s->id] = s;
    cv_.notify_all();
    return s->id;
  }
  // Thread-safe; the stream gets no more tokens (its callback is not called
  // again once cancel returns, except by a step already running it).
  void cancel(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_id_.find(id);
    if (it != by_id_.end()) it->second->cancelled = true;
  }
  // Called on the stepping thread after each step's callbacks (the epoll
  // server wakes its loop once per step here).
  void set_after_step(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    after_step_ = std::move(fn);
  }

 private:
  struct Stream {
    uint64_t id = 0;
    int64_t n_tokens = 0;
    int64_t next = 0;
    bool cancelled = false;
    TokenFn fn;
  };

  void loop() {
    // Steps fall on a fixed grid (epoch + k * step), busy or idle, so a
    // request waits for the next step by the same uniform phase whatever
    // server submitted it.
    const auto epoch = std::chrono::steady_clock::now();
    auto next_step = epoch;
    std::vector<std::shared_ptr<Stream>> batch;
    for (;;) {
      std::function<void()> after;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !running_.empty() || !waiting_.empty(); });
        if (stop_) return;
        const auto now = std::chrono::steady_clock::now();
        if (next_step < now) next_step = epoch + ((now - epoch) / step_ + 1) * step_;  // after idling
        cv_.wait_until(lock, next_step, [&] { return stop_; });
        if (stop_) return;
        next_step += step_;
        // Drop finished or cancelled streams, then admit the waiting ones.
        std::vector<std::shared_ptr<Stream>> kept;
        for (auto& s : running_) {
          if (s->cancelled || s->next >= s->n_tokens) {
            by_id_.erase(s->id);
          } else {
            kept.push_back(std::move(s));
          }
        }
        running_ = std::move(kept);
        while (static_cast<int64_t>(running_.size()) < max_running_ && !waiting_.empty()) {
          if (!waiting_.front()->cancelled) {
            running_.push_back(waiting_.front());
          } else {
            by_id_.erase(waiting_.front()->id);
          }
          waiting_.pop_front();
        }
        batch.clear();
        for (auto& s : running_)
          if (!s->cancelled) batch.push_back(s);
        after = after_step_;
      }
      for (auto& s : batch) {
        const int64_t token = s->next++;
        s->fn(token, s->next >= s->n_tokens);
      }
      if (after) after();
    }
  }

  const int64_t max_running_;
  const std::chrono::microseconds step_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Stream>> waiting_;
  std::vector<std::shared_ptr<Stream>> running_;  // engine thread reads `next` outside the lock; only it writes it
  std::unordered_map<uint64_t, std::shared_ptr<Stream>> by_id_;
  std::function<void()> after_step_;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  std::thread thread_;  // the stepping thread, started by the constructor
};

}  // namespace shardlm::bench
