// Hugging Face tokenizer.json tokenizers (byte-level BPE: Qwen2/2.5/3,
// Llama-3; SentencePiece-style BPE with "▁" and byte fallback: Llama 2,
// Mixtral, Mistral v0.3) with exactly the ids of HF tokenizers / transformers.js.
//
//   Tokenizer tok = Tokenizer::load("/models/Qwen3-8B");  // tokenizer.json (+ tokenizer_config.json)
//   std::vector<TokenId> ids = tok.encode("Hello", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/false);
//   StreamDecoder stream(tok);   // per sequence: text.append(stream.feed(id)) ... stream.flush()
//
// Encoding: added tokens are cut out of the raw text first (leftmost,
// longest); every other section goes through normalizer -> pre_tokenizer ->
// BPE; then the post_processor adds its template tokens (Llama-3's BOS) when
// add_special_tokens is true. A Tokenizer is immutable after load and safe to
// use from several threads at once; copies share the loaded tables.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

using TokenId = int32_t;

class Tokenizer {
 public:
  // Loads dir/tokenizer.json and, when present, dir/tokenizer_config.json
  // (bos_token, eos_token, pad_token, unk_token: strings or {"content": ...}).
  // Throws Error(kNotFound) when tokenizer.json is missing, kCorruptFile
  // naming the file and field when it is malformed, kUnsupported for model,
  // normalizer, pre_tokenizer, post_processor or decoder types we lack.
  static Tokenizer load(const std::filesystem::path& dir);
  // Same from JSON text; config_json may be empty. source names the origin
  // in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {},
                             const std::string& source = "tokenizer.json");

  // text must be valid UTF-8 (kInvalidArgument naming the byte otherwise).
  // Added tokens in the text (e.g. "<|im_end|>") always become their ids;
  // add_special_tokens only controls the post-processor template.
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens = true) const;
  // Like encode(text, false) but added tokens in the text are ordinary text
  // (use for untrusted content that must not inject control tokens).
  std::vector<TokenId> encode_ordinary(std::string_view text) const;

  // Concatenates the bytes of the tokens and repairs invalid UTF-8 with
  // U+FFFD. Ids without a token (>= vocab_size(), negative, or holes) decode
  // to nothing. No clean-up of spaces before punctuation is done.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;

  // The raw bytes one token stands for ("Ġhello" -> " hello"; an added token
  // -> its content); empty for ids without a token. May be partial UTF-8.
  std::string_view token_bytes(TokenId id) const;
  // Spaces the decoder drops from the start of a decoded text (SentencePiece
  // tokenizers drop the one their "▁" prefix added; 0 for byte-level ones).
  size_t leading_spaces_stripped() const;

  // Vocabulary strings as in tokenizer.json (byte-level spelling, "Ġhello").
  std::optional<TokenId> token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(TokenId id) const;

  // 1 + the largest id of the vocab and added tokens (Qwen3: 151669). The
  // model's embedding may be larger; ids in between decode to nothing.
  int32_t vocab_size() const;

  // From tokenizer_config.json (nullopt when absent or null there).
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  std::optional<TokenId> pad_id() const;
  std::optional<TokenId> unk_id() const;

  // Added tokens flagged "special" (skipped by skip_special_tokens).
  bool is_special(TokenId id) const;
  std::vector<TokenId> special_ids() const;

  // The normalizer alone (NFC for Qwen, identity for Llama-3).
  std::string normalize(std::string_view text) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Incremental detokenisation for streaming: feed ids one at a time and get
// the text they complete. Bytes of a character split across tokens (emoji,
// CJK) are held back until the character is complete, so every returned
// piece is valid UTF-8 and the concatenation of all pieces plus flush()
// equals tok.decode(all ids). Keeps a (cheap, shared) copy of the Tokenizer.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Newly completed text (possibly empty). Bytes that can never become
  // valid are replaced with U+FFFD at once.
  std::string feed(TokenId id);
  // Whatever is held back, with incomplete sequences replaced by U+FFFD;
  // the decoder is then empty and can be reused.
  std::string flush();
  // Bytes currently held back (0..3).
  size_t n_pending_bytes() const { return pending_.size(); }

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;
  size_t strip_left_ = 0;  // leading spaces still to drop (see leading_spaces_stripped)
};

}  // namespace shardlm
