// tokenizer.json "pre_tokenizer": Split (regex or literal, every HF split
// behaviour, invert), ByteLevel (add_prefix_space, use_regex with the GPT-2
// pattern), Digits, Metaspace (" " -> "▁", prepend_scheme always/first/never,
// split on "▁" merged with the next piece), and Sequence of those. Pieces flow through the steps in
// order; BPE then runs on each final piece on its own.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace shardlm {

class PreTokenizer {
 public:
  PreTokenizer() = default;  // one piece: the whole text
  PreTokenizer(const nlohmann::json& config, const std::string& where);

  // Appends the pieces of text to out (empty pieces are dropped).
  // first_section: text starts the input (not after an added token), which
  // is where Metaspace's prepend_scheme "first" adds its "▁".
  void apply(std::string_view text, std::vector<std::string>& out, bool first_section = true) const;

  // True when a ByteLevel step maps bytes to GPT-2 stand-in characters.
  bool byte_level() const { return byte_level_; }

 private:
  enum class Kind { kSplit, kByteLevel, kDigits, kMetaspace };
  enum class Prepend { kAlways, kFirst, kNever };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    Kind kind;
    std::shared_ptr<Regex> regex;  // Split with a Regex pattern, ByteLevel with use_regex
    std::string literal;           // Split with a String pattern
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool individual_digits = false;
    std::string replacement;  // Metaspace: "▁"
    Prepend prepend = Prepend::kAlways;
    bool split_on_replacement = false;
  };
  void add(const nlohmann::json& config, const std::string& where);
  void split(const Step& step, std::string_view text, std::vector<std::string>& out) const;
  void run_step(const Step& step, std::string_view piece, bool first_piece, std::vector<std::string>& out) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace shardlm
