// Detokenizer over the tokenizer layer's StreamDecoder: valid UTF-8 pieces
// whose concatenation equals Tokenizer::decode of all generated ids.
#pragma once

#include "engine/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {

class TokenizerDetokenizer final : public Detokenizer {
 public:
  explicit TokenizerDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  std::unique_ptr<DetokenizerStream> stream(std::span<const int32_t> prompt_ids,
                                            bool skip_special_tokens) const override;

 private:
  const Tokenizer& tokenizer_;
};

}  // namespace shardlm
