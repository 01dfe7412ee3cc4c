#include "engine/stop_strings.h"

#include <algorithm>

namespace shardlm {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops, bool include_in_output)
    : include_in_output_(include_in_output) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
  for (const auto& s : stops_) max_len_ = std::max(max_len_, s.size());
}

std::string StopStringMatcher::push(const std::string& piece, bool check) {
  if (matched_) return {};
  const size_t old_size = text_.size();
  text_ += piece;
  if (check && !stops_.empty() && !piece.empty()) {
    // A match must end inside the new piece.
    const size_t from = old_size >= max_len_ - 1 ? old_size - (max_len_ - 1) : 0;
    size_t best = std::string::npos;
    const std::string* best_stop = nullptr;
    for (const auto& s : stops_) {
      size_t pos = text_.find(s, from);
      if (pos != std::string::npos && pos < best) {
        best = pos;
        best_stop = &s;
      }
    }
    if (best_stop) {
      matched_ = *best_stop;
      text_.resize(include_in_output_ ? best + best_stop->size() : best);
      std::string out = text_.size() > n_emitted_ ? text_.substr(n_emitted_) : std::string();
      n_emitted_ = text_.size();
      return out;
    }
  }
  // Hold back the last max_len-1 bytes (a stop string may be starting),
  // never splitting a UTF-8 character.
  size_t safe = text_.size() >= max_len_ ? text_.size() - (max_len_ ? max_len_ - 1 : 0) : 0;
  while (safe > n_emitted_ && safe < text_.size() && (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80) --safe;
  if (safe <= n_emitted_) return {};
  std::string out = text_.substr(n_emitted_, safe - n_emitted_);
  n_emitted_ = safe;
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out = text_.size() > n_emitted_ ? text_.substr(n_emitted_) : std::string();
  n_emitted_ = text_.size();
  return out;
}

}  // namespace shardlm
