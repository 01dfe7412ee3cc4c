// tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD (utf8proc), Lowercase,
// Prepend, Replace, Strip, and Sequence of those; null means none.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace shardlm {

// Unicode normalisation of valid UTF-8 text (kInvalidArgument otherwise).
std::string normalize_nfc(std::string_view text);
std::string normalize_nfkc(std::string_view text);

class Normalizer {
 public:
  Normalizer() = default;  // identity
  // config is the "normalizer" value; `where` names file and field in errors.
  Normalizer(const nlohmann::json& config, const std::string& where);

  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kStrip };
  struct Step {
    Kind kind;
    std::string text;     // Prepend: prefix; Replace: content
    std::string literal;  // Replace with a String pattern
    std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
    bool strip_left = false, strip_right = false;
  };
  void add(const nlohmann::json& config, const std::string& where);

  std::vector<Step> steps_;
};

}  // namespace shardlm
