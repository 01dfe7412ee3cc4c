// Incremental detokenization seen from the engine: one stream per sequence,
// fed token by token, returning only text that is final (no broken UTF-8).
// The tokenizer layer provides the real one (its StreamDecoder); tests use a
// toy. Keeping it an interface lets the engine run without a tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace shardlm {

class DetokenizerStream {
 public:
  virtual ~DetokenizerStream() = default;
  // New final text after appending token_id (may be empty while a multi-byte
  // character or a merge is pending).
  virtual std::string push(int32_t token_id) = 0;
  // Whatever is still pending at the end of the sequence.
  virtual std::string flush() { return {}; }
};

class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  // prompt_ids: context for tokenizers whose text depends on the previous
  // token (leading-space rules); the prompt's own text is not returned.
  virtual std::unique_ptr<DetokenizerStream> stream(std::span<const int32_t> prompt_ids,
                                                    bool skip_special_tokens) const = 0;
};

}  // namespace shardlm
