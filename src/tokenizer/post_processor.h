// tokenizer.json "post_processor" for single sequences: TemplateProcessing
// (Llama-3's "<|begin_of_text|> $A"), BertProcessing/RobertaProcessing
// (cls $A sep), ByteLevel (offsets only: no ids), and Sequence of those.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

using TokenId = int32_t;

class PostProcessor {
 public:
  using Lookup = std::function<std::optional<TokenId>(std::string_view)>;

  PostProcessor() = default;  // adds nothing
  // lookup resolves token strings named by the template to ids.
  PostProcessor(const nlohmann::json& config, const std::string& where, const Lookup& lookup);

  // Wraps ids of one sequence with the special tokens of the template.
  std::vector<TokenId> apply(std::vector<TokenId> ids) const;

  // Ids added before and after the sequence (for inspection and tests).
  const std::vector<TokenId>& prefix() const { return prefix_; }
  const std::vector<TokenId>& suffix() const { return suffix_; }

 private:
  void add(const nlohmann::json& config, const std::string& where, const Lookup& lookup);

  std::vector<TokenId> prefix_;
  std::vector<TokenId> suffix_;
};

}  // namespace shardlm
