#include "server/routing_policy.h"

#include <algorithm>
#include <limits>

#include <xxhash.h>

namespace shardlm::server {

RoutingPolicy::RoutingPolicy(size_t n, RoutingOptions options)
    : options_(options), outstanding_(n, 0), in_flight_(n, 0), healthy_(n, true) {}

int RoutingPolicy::acquire(const std::string& prompt, int64_t cost, const std::vector<int>& excluded, bool any_health) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int n = static_cast<int>(outstanding_.size());
  auto usable = [&](int r) {
    return (any_health || healthy_[r]) && std::find(excluded.begin(), excluded.end(), r) == excluded.end();
  };
  int least = -1;
  for (int r = 0; r < n; ++r) {
    if (!usable(r)) continue;
    if (least < 0 || outstanding_[r] < outstanding_[least] ||
        (outstanding_[r] == outstanding_[least] && in_flight_[r] < in_flight_[least]))
      least = r;
  }
  if (least < 0) return -1;
  int chosen = least;
  if (prompt.size() >= options_.min_affinity_prefix_bytes) {
    // Rendezvous hashing over the usable replicas: the prefix keeps its
    // replica when others come and go.
    const size_t len = std::min(prompt.size(), options_.affinity_prefix_bytes);
    const uint64_t key = XXH3_64bits(prompt.data(), len);
    int pinned = -1;
    uint64_t best = 0;
    for (int r = 0; r < n; ++r) {
      if (!usable(r)) continue;
      uint64_t score = XXH3_64bits_withSeed(&key, sizeof key, static_cast<uint64_t>(r) + 1);
      if (pinned < 0 || score > best) {
        pinned = r;
        best = score;
      }
    }
    if (outstanding_[pinned] - outstanding_[least] <= options_.affinity_slack_tokens) chosen = pinned;
  }
  outstanding_[chosen] += cost;
  in_flight_[chosen] += 1;
  return chosen;
}

void RoutingPolicy::release(int r, int64_t cost) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (r < 0 || r >= static_cast<int>(outstanding_.size())) return;
  outstanding_[r] -= cost;
  in_flight_[r] -= 1;
}

void RoutingPolicy::set_healthy(int r, bool healthy) {
  std::lock_guard<std::mutex> lock(mutex_);
  healthy_.at(r) = healthy;
}

bool RoutingPolicy::healthy(int r) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return healthy_.at(r);
}

int64_t RoutingPolicy::outstanding_tokens(int r) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outstanding_.at(r);
}

}  // namespace shardlm::server
