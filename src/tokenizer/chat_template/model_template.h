// A model directory's chat template as transformers applies it:
// chat_template.jinja when present (transformers >= 4.43 saves it there), else
// the "chat_template" of tokenizer_config.json (a string, or the "default" of
// a list of named templates), with tokenizer_config.json's bos/eos strings.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "tokenizer/chat_template/chat_template.h"

namespace shardlm::chat_template {

struct ModelChatTemplate {
  ChatTemplate tmpl;
  std::string bos_token;
  std::string eos_token;
  std::string source;  // the template text (the server detects its tool-call format from it)
  std::string render(const ChatInputs& inputs, const RenderOptions& options = {}) const;  // fills bos/eos unless set
};

// nullopt when the directory has no chat template; throws
// Error(kCorruptFile / kInvalidArgument) naming the file when it is malformed,
// too large (kMaxChatTemplateBytes), or its template does not parse (a syntax
// error, or nesting past Limits::max_nesting).
constexpr size_t kMaxChatTemplateBytes = size_t{4} << 20;
// `limits`: what one render may cost (serve's --chat-template-max-* flags).
std::optional<ModelChatTemplate> load_model_chat_template(const std::filesystem::path& model_dir,
                                                          const Limits& limits = {});

}  // namespace shardlm::chat_template
