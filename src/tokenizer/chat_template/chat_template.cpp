#include "tokenizer/chat_template/chat_template.h"
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat_template/interpreter.h"

namespace shardlm::chat_template {

ChatTemplate ChatTemplate::compile(std::string_view source, Limits limits) {
  ChatTemplate t;
  t.limits_ = std::make_shared<const Limits>(limits);
  t.body_ = std::make_shared<const Body>(parse_template(source, *t.limits_));
  return t;
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context, const RenderOptions& options) const {
  if (!context.is_object())
    fail(ErrorCode::kInvalidArgument, "chat template context must be a JSON object of variables, found ",
         context.type_name());
  Interpreter interpreter(*limits_, options.now, options.cancelled);
  return interpreter.render(*body_, Value::from_json(context));
}

nlohmann::ordered_json chat_context(const ChatInputs& inputs) {
  if (!inputs.messages.is_array())
    fail(ErrorCode::kInvalidArgument, "chat template: messages must be a JSON array, found ",
         inputs.messages.type_name());
  if (!inputs.extra.is_object())
    fail(ErrorCode::kInvalidArgument, "chat template: extra kwargs must be a JSON object, found ",
         inputs.extra.type_name());
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = inputs.messages;
  ctx["tools"] = inputs.tools;
  ctx["documents"] = inputs.documents;
  ctx["add_generation_prompt"] = inputs.add_generation_prompt;
  ctx["bos_token"] = inputs.bos_token;
  ctx["eos_token"] = inputs.eos_token;
  for (auto it = inputs.extra.begin(); it != inputs.extra.end(); ++it) ctx[it.key()] = it.value();
  return ctx;
}

std::string render_chat(const ChatTemplate& tmpl, const ChatInputs& inputs, const RenderOptions& options) {
  return tmpl.render(chat_context(inputs), options);
}

}  // namespace shardlm::chat_template
