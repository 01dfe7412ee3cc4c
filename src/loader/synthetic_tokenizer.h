// A small but real byte-level BPE tokenizer for synthetic checkpoints, in the
// Hugging Face tokenizer.json format Qwen2 uses: NFC normalizer, a Split
// pre-tokenizer with the Qwen2 regex followed by ByteLevel(use_regex=false),
// a BPE model over the GPT-2 byte<->unicode alphabet, a ByteLevel decoder.
//
// Ids: 0..255 the 256 byte tokens (in GPT-2 bytes_to_unicode order, as real
// byte-level vocabularies start), then one id per merge, learned
// deterministically from an embedded English + code text, then the special
// tokens <|endoftext|>, <|im_start|>, <|im_end|> (added_tokens, not in
// model.vocab, as in Qwen's tokenizer.json). Ties in merge counts are broken
// by the lexicographically smallest pair, so the result never varies.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

// Merges make-model asks for when the model vocabulary leaves room.
constexpr int kSyntheticDefaultMerges = 400;
constexpr int kSyntheticByteTokens = 256;
constexpr int kSyntheticSpecialTokens = 3;

// The Qwen2 pre-tokenizer regex (tokenizer.json Split pattern).
extern const char* const kQwen2PretokenizeRegex;

struct SyntheticTokenizer {
  std::vector<std::string> tokens;  // [n_vocab]: id -> token string (byte-level alphabet / special text)
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  int64_t endoftext_id = 0;  // "<|endoftext|>"
  int64_t im_start_id = 0;   // "<|im_start|>"
  int64_t im_end_id = 0;     // "<|im_end|>"
  int64_t n_vocab() const { return static_cast<int64_t>(tokens.size()); }
};

// The largest tokenizer that fits in a model vocabulary of model_vocab ids:
// min(kSyntheticDefaultMerges, model_vocab - 259) merges, at most as many as
// the embedded text yields. Throws Error(kInvalidArgument) if model_vocab <
// 259 (256 byte tokens + 3 special tokens must fit).
SyntheticTokenizer build_synthetic_tokenizer(int64_t model_vocab, int n_merges = kSyntheticDefaultMerges);

// The tokenizer.json object.
nlohmann::json synthetic_tokenizer_json(const SyntheticTokenizer& tok);

// The ChatML template (Qwen style, with Qwen2.5's default system prompt when
// the conversation has none).
extern const char* const kSyntheticChatTemplate;

// The tokenizer_config.json object (chat_template, eos "<|im_end|>", pad
// "<|endoftext|>", no bos, added_tokens_decoder).
nlohmann::json synthetic_tokenizer_config_json(const SyntheticTokenizer& tok, int64_t model_max_length);

// GPT-2's bytes_to_unicode: the UTF-8 text of the printable stand-in for byte b.
std::string byte_to_unicode(uint8_t b);

// The text merges are learned from (exposed so tests can encode it).
extern const char* const kSyntheticTrainingText;

}  // namespace shardlm
