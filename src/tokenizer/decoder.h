// tokenizer.json "decoder": how token strings become text. Supported:
//   ByteLevel                       GPT-2 stand-ins back to bytes (Qwen, Llama 3)
//   Metaspace                       "▁" -> " ", the first leading space dropped (Mistral v0.3)
//   Sequence of Replace (String), ByteFallback, Fuse, Strip
//                                   SentencePiece-style BPE (Llama 2, Mixtral):
//                                   "▁" -> " ", "<0x0A>" -> byte 0x0A, fused, one leading " " stripped
//   null                            tokens concatenated as they are
// shardlm decodes by concatenating each id's bytes, so every decoder is
// expressed as a per-token mapping plus a number of leading spaces that are
// stripped from the start of the whole text (Strip after Fuse, Metaspace's
// first token). A decoder that cannot be put this way is refused by name.
#pragma once

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace shardlm {

class Decoder {
 public:
  Decoder() = default;  // null: raw concatenation
  Decoder(const nlohmann::json& config, const std::string& where);

  // The bytes one vocabulary token stands for.
  std::string token_bytes(std::string_view token) const;
  // Spaces (0x20) dropped from the start of the decoded text, at most this many.
  size_t leading_spaces_stripped() const { return strip_leading_; }

 private:
  void add(const nlohmann::json& config, const std::string& where, bool in_sequence);

  bool byte_level_ = false;
  bool byte_fallback_ = false;
  bool fused_ = false;  // a Fuse step came before (Strip is then on the whole text)
  struct Replacement {
    std::string from, to;
  };
  std::vector<Replacement> replacements_;  // in order
  size_t strip_leading_ = 0;
};

}  // namespace shardlm
