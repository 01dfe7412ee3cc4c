// BPE model of tokenizer.json ("model": {"type": "BPE", "vocab", "merges"}):
// rank-based merging over a linked list of symbols with a min-heap of
// candidate pairs (lowest rank first, leftmost on ties), as HF tokenizers.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardlm {

using TokenId = int32_t;

class BpeModel {
 public:
  BpeModel() = default;
  // config is the "model" object; `where` names the file and field in errors.
  BpeModel(const nlohmann::json& config, const std::string& where);

  // Appends the ids of one pre-tokenized piece (already byte-level mapped
  // when the pre-tokenizer is ByteLevel).
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;

  std::optional<TokenId> token_to_id(std::string_view token) const;
  // Vocabulary entries by id (empty string where an id has no entry).
  const std::vector<std::string>& id_to_token() const { return id_to_token_; }

 private:
  struct Merge {
    uint32_t rank;
    TokenId merged;
  };
  static uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void initial_symbols(std::string_view piece, std::vector<TokenId>& symbols) const;
  const Merge* find_merge(TokenId left, TokenId right) const;

  std::unordered_map<std::string, TokenId> vocab_;
  std::vector<std::string> id_to_token_;
  // Open-addressing table pair_key(left, right) -> (rank, merged id): the
  // merge lookup is the hot loop of encoding. Empty slots have key kNoKey.
  static constexpr uint64_t kNoKey = ~uint64_t{0};
  std::vector<uint64_t> merge_keys_;
  std::vector<Merge> merge_values_;
  uint64_t merge_mask_ = 0;
  // Id of each single-code-point token below U+0200 (covers the byte-level
  // stand-ins), -1 if none; lets byte-level pieces skip string lookups.
  std::vector<TokenId> small_char_id_;
  std::optional<TokenId> unk_id_;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
};

}  // namespace shardlm
