// The in-memory store behind /v1/responses' `store` (default true, as
// OpenAI's): GET /v1/responses/{id} answers from it and previous_response_id
// continues from it. Bounded by count and by bytes (--responses-store-max-*);
// past either bound the oldest responses are evicted first. Lost on restart.
#pragma once

#include <cstddef>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "server/serving_backend.h"

namespace shardlm::server {

struct StoredResponse {
  ordered_json response;  // the response object, as GET returns it
  ordered_json history;   // the conversation through it as chat messages (instructions excluded, as OpenAI's
                          // previous_response_id does not carry them over)
};

class ResponseStore {
 public:
  ResponseStore(size_t max_count, size_t max_bytes) : max_count_(max_count), max_bytes_(max_bytes) {}
  // Stores (or replaces) `id`, evicting the oldest until both bounds hold.
  // One response larger than max_bytes alone is not stored: false.
  bool put(const std::string& id, StoredResponse response);
  std::optional<StoredResponse> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  struct Entry {
    StoredResponse value;
    size_t bytes = 0;
    std::list<std::string>::iterator order;
  };
  void erase_locked(std::unordered_map<std::string, Entry>::iterator it);

  const size_t max_count_;
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, Entry> entries_;
  size_t bytes_ = 0;
};

}  // namespace shardlm::server
