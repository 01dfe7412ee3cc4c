// tokenizer.json "added_tokens": tokens matched in the raw text before any
// normalisation or BPE (leftmost, then longest), honouring lstrip/rstrip
// (absorb neighbouring whitespace) and single_word (not inside a word).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

using TokenId = int32_t;

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// One section of the input: either plain text for the normaliser and BPE, or
// an added token.
struct TextSection {
  std::string_view text;
  const AddedToken* token = nullptr;
};

class AddedVocab {
 public:
  AddedVocab() = default;
  AddedVocab(const nlohmann::json& list, const std::string& where);

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  std::vector<TextSection> split(std::string_view text) const;

 private:
  // Whether token matches at text[pos]; sets [*begin, *end) to the span it
  // takes including stripped whitespace.
  bool matches(const AddedToken& token, std::string_view text, size_t pos, size_t floor, size_t* begin,
               size_t* end) const;

  std::vector<AddedToken> tokens_;
  std::array<std::vector<uint32_t>, 256> by_first_byte_;  // indices into tokens_, longest first
};

}  // namespace shardlm
