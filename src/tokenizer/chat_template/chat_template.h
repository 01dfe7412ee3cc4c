// Hugging Face chat templates: a sandboxed interpreter for the Jinja subset the
// Qwen2.5 / Qwen3 / Llama-3.x templates use, rendering byte-identically to
// Python's jinja2 as transformers configures it:
//   ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                 extensions=[loopcontrols])
// plus transformers' tojson filter (json.dumps with ensure_ascii=False) and the
// raise_exception / strftime_now globals.
//
//   auto t = ChatTemplate::compile(tokenizer_config["chat_template"]);
//   std::string prompt = render_chat(t, {.messages = msgs, .add_generation_prompt = true,
//                                        .bos_token = "<|begin_of_text|>"});
//
// Errors (syntax, undefined use, type errors, raise_exception, limits) throw
// shardlm::Error(kInvalidArgument) whose message starts "chat template line N: ".
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template/ast.h"

namespace shardlm::chat_template {

struct RenderOptions {
  // Time strftime_now() formats (local time); nullopt = the current time.
  std::optional<std::time_t> now;
  // Polled every 65,536 evaluation steps (a few ms); true stops the render
  // with an error: the server passes "the client has gone".
  std::function<bool()> cancelled;
};

class ChatTemplate {
 public:
  // Parses `source`; throws shardlm::Error on a syntax error or an unsupported tag.
  static ChatTemplate compile(std::string_view source, Limits limits = {});

  // Renders with `context` (a JSON object) as the template's variables.
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& options = {}) const;

  const Limits& limits() const { return *limits_; }

 private:
  std::shared_ptr<const Body> body_;
  std::shared_ptr<const Limits> limits_;
};

// The variables transformers' apply_chat_template passes to the template.
struct ChatInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;      // null: the template sees tools=None
  nlohmann::ordered_json documents = nullptr;  // null: documents=None
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  // chat_template_kwargs, e.g. {"enable_thinking": false}; these override the fields above.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

nlohmann::ordered_json chat_context(const ChatInputs& inputs);
std::string render_chat(const ChatTemplate& tmpl, const ChatInputs& inputs, const RenderOptions& options = {});

}  // namespace shardlm::chat_template
