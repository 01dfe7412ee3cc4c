// Requests on their way to an engine. A front end (serve's HTTP server)
// announces each request once it has received it whole, before it parses,
// renders and tokenizes it, and withdraws the announcement when the request
// has gone to the engine (or was refused). An engine that wakes from idle to
// new submissions waits, for a bounded time, while requests are announced,
// so that a burst of clients arriving together is admitted whole: prefilled
// in the first step instead of split over two, where the second group's
// prefill would stall the first group's decode (EngineConfig::burst_window_ms).
//
// Measured on a 2-core CPU (README "Performance"): 16 requests from 16
// connections reach the engine over about 10 ms, each parsed on its own HTTP
// worker; the engine woke at the first and started prefilling 1 to 8 of them.
//
// Thread-safe. Tickets may outlive neither the Arrivals nor its listeners'
// owners' removal: Engine removes its listener in its destructor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace shardlm {

class Arrivals : public std::enable_shared_from_this<Arrivals> {
 public:
  using Clock = std::chrono::steady_clock;

  // One announced request. Moving hands the announcement over; release (or
  // the destructor) withdraws it, once.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept : owner_(std::move(other.owner_)) {}
    Ticket& operator=(Ticket&& other) noexcept {
      if (this != &other) {
        release();
        owner_ = std::move(other.owner_);
      }
      return *this;
    }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket() { release(); }
    void release();
    bool held() const { return owner_ != nullptr; }

   private:
    friend class Arrivals;
    explicit Ticket(std::shared_ptr<Arrivals> owner) : owner_(std::move(owner)) {}
    std::shared_ptr<Arrivals> owner_;
  };

  // Make with std::make_shared (tickets keep their Arrivals alive).
  Arrivals() = default;

  Ticket announce();
  int64_t n_pending() const { return n_pending_.load(std::memory_order_acquire); }
  // When the newest announcement was made (epoch when none was).
  Clock::time_point last_announced() const;
  // Announcements ever made (tests wait on it).
  int64_t n_announced() const { return n_announced_.load(std::memory_order_acquire); }

  // `wake` runs on the announcing or releasing thread, with this object's
  // lock held, after each change: it must only signal (an engine takes its
  // own lock and notifies its condition variable), never call back into
  // this object.
  int add_listener(std::function<void()> wake);
  void remove_listener(int id);

  // Engines: an engine began waiting for the announced requests, and how many
  // times that happened; tests wait on it to know the engine is holding a
  // submission back.
  void note_engine_waiting();
  int64_t n_engine_waits() const;
  // Blocks until n_engine_waits() reaches n or `timeout` passes; returns
  // whether it reached n. For tests.
  bool wait_for_engine_waits(int64_t n, std::chrono::milliseconds timeout) const;

 private:
  void withdraw();
  void notify_locked();

  // Lock order: mutex_, then a listener's own lock (an engine's). An engine
  // holding its lock reads only the atomics, and counts its waits under
  // waits_mutex_, never under mutex_.
  mutable std::mutex mutex_;  // listeners_, and the changes that notify them
  std::vector<std::pair<int, std::function<void()>>> listeners_;
  int next_listener_ = 1;
  std::atomic<int64_t> n_pending_{0};
  std::atomic<int64_t> n_announced_{0};
  std::atomic<Clock::rep> last_announced_{0};  // Clock ticks since its epoch
  mutable std::mutex waits_mutex_;
  mutable std::condition_variable waits_cv_;
  int64_t n_engine_waits_ = 0;
};

}  // namespace shardlm
