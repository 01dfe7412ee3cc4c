// Stop strings on detokenized text, streamed: text that could still turn
// into the start of a stop string is held back, and the output never
// contains the stop string (unless asked), like vLLM.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace shardlm {

class StopStringMatcher {
 public:
  StopStringMatcher(std::vector<std::string> stops, bool include_in_output);

  // Appends text; returns the text now safe to emit. Once a stop string is
  // found, stopped() is true and the returned text ends where it starts.
  // check = false (before min_tokens): the text is held and emitted as usual
  // but no stop string is matched in it.
  std::string push(const std::string& text, bool check = true);
  // End of sequence for another reason: everything still held back.
  std::string flush();

  bool stopped() const { return matched_.has_value(); }
  const std::optional<std::string>& matched() const { return matched_; }
  const std::string& text() const { return text_; }  // all text emitted or held so far

 private:
  std::vector<std::string> stops_;
  bool include_in_output_;
  size_t max_len_ = 0;
  std::string text_;
  size_t n_emitted_ = 0;
  std::optional<std::string> matched_;
};

}  // namespace shardlm
