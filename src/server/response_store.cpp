#include "server/response_store.h"

#include <nlohmann/json.hpp>

namespace shardlm::server {

namespace {
// What an entry costs: its JSON as text (the in-memory tree is a few times
// larger, but proportional, so the bound scales the same).
size_t cost_of(const StoredResponse& r) {
  return r.response.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size() +
         r.history.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size();
}
}  // namespace

void ResponseStore::erase_locked(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  order_.erase(it->second.order);
  entries_.erase(it);
}

bool ResponseStore::put(const std::string& id, StoredResponse response) {
  const size_t cost = cost_of(response);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = entries_.find(id); it != entries_.end()) erase_locked(it);
  if (max_count_ == 0 || cost > max_bytes_) return false;
  while (!order_.empty() && (entries_.size() + 1 > max_count_ || bytes_ + cost > max_bytes_))
    erase_locked(entries_.find(order_.front()));
  order_.push_back(id);
  entries_.emplace(id, Entry{std::move(response), cost, std::prev(order_.end())});
  bytes_ += cost;
  return true;
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  erase_locked(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace shardlm::server
