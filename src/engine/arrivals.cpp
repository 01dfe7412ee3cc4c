#include "engine/arrivals.h"

#include <algorithm>
#include <condition_variable>

namespace shardlm {

void Arrivals::Ticket::release() {
  if (!owner_) return;
  std::shared_ptr<Arrivals> owner = std::move(owner_);
  owner_.reset();
  owner->withdraw();
}

Arrivals::Ticket Arrivals::announce() {
  std::lock_guard<std::mutex> lock(mutex_);
  n_pending_.fetch_add(1, std::memory_order_acq_rel);
  n_announced_.fetch_add(1, std::memory_order_acq_rel);
  last_announced_.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
  notify_locked();
  return Ticket(shared_from_this());
}

void Arrivals::withdraw() {
  std::lock_guard<std::mutex> lock(mutex_);
  n_pending_.fetch_sub(1, std::memory_order_acq_rel);
  notify_locked();
}

Arrivals::Clock::time_point Arrivals::last_announced() const {
  return Clock::time_point(Clock::duration(last_announced_.load(std::memory_order_acquire)));
}

int Arrivals::add_listener(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mutex_);
  listeners_.emplace_back(next_listener_, std::move(wake));
  return next_listener_++;
}

void Arrivals::remove_listener(int id) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(listeners_, [id](const auto& l) { return l.first == id; });
}

void Arrivals::notify_locked() {
  for (auto& [id, wake] : listeners_) wake();
}

void Arrivals::note_engine_waiting() {
  {
    std::lock_guard<std::mutex> lock(waits_mutex_);
    ++n_engine_waits_;
  }
  waits_cv_.notify_all();
}

int64_t Arrivals::n_engine_waits() const {
  std::lock_guard<std::mutex> lock(waits_mutex_);
  return n_engine_waits_;
}

bool Arrivals::wait_for_engine_waits(int64_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(waits_mutex_);
  return waits_cv_.wait_for(lock, timeout, [&] { return n_engine_waits_ >= n; });
}

}  // namespace shardlm
