// PCRE2 regex (UTF + UCP, JIT when available) for pre-tokenizer patterns
// such as Qwen's "(?i:'s|'t|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|...".
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardlm {

class Regex {
 public:
  // Throws Error(kUnsupported) naming `where` when PCRE2 rejects the pattern.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Non-overlapping matches, left to right, as [begin, end) byte offsets;
  // empty matches are skipped. text must be valid UTF-8 (not re-checked).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardlm
