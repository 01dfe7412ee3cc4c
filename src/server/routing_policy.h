// Which replica serves a request: the least outstanding work, except that
// requests sharing a long prefix stay on one replica so its prefix cache
// hits, as long as that replica is not much busier than the idlest one.
// Used by the in-process data-parallel backend and by `shardlm router`.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace shardlm::server {

struct RoutingOptions {
  size_t affinity_prefix_bytes = 512;   // prompt bytes that define "the same prefix"
  size_t min_affinity_prefix_bytes = 64;  // shorter prompts are not worth pinning
  // Affinity yields when the pinned replica has this many more outstanding
  // tokens than the least loaded one.
  int64_t affinity_slack_tokens = 4096;
};

class RoutingPolicy {
 public:
  RoutingPolicy(size_t n_replicas, RoutingOptions options = {});

  // Picks a healthy replica for a prompt (its text or rendered chat), or -1
  // when none is healthy; `excluded` replicas (already tried) are skipped.
  // any_health: unhealthy replicas are candidates too (a caller whose
  // healthy ones are all tried). Counts `cost_tokens` as outstanding on it
  // until release().
  int acquire(const std::string& prompt, int64_t cost_tokens, const std::vector<int>& excluded = {},
              bool any_health = false);
  void release(int replica, int64_t cost_tokens);
  void set_healthy(int replica, bool healthy);
  bool healthy(int replica) const;
  int64_t outstanding_tokens(int replica) const;
  size_t size() const { return outstanding_.size(); }

 private:
  RoutingOptions options_;
  mutable std::mutex mutex_;
  std::vector<int64_t> outstanding_;  // [n_replicas] tokens in flight
  std::vector<int64_t> in_flight_;    // [n_replicas] requests in flight (tie-break)
  std::vector<bool> healthy_;
};

}  // namespace shardlm::server
