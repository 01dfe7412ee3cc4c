#include "tokenizer/chat_template/model_template.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bounded_json_file.h"
#include "core/error.h"

namespace shardlm::chat_template {

namespace {

// bos_token / eos_token are strings or {"content": "..."} objects.
std::string special_token(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return "";
}

// The template's source compiled, its errors naming the file it came from.
ChatTemplate compile_from(const std::string& source, const std::filesystem::path& path, const Limits& limits) {
  try {
    return ChatTemplate::compile(source, limits);
  } catch (const Error& e) {
    fail(e.code(), path.string(), ": ", e.what());
  }
}

}  // namespace

std::string ModelChatTemplate::render(const ChatInputs& inputs, const RenderOptions& options) const {
  ChatInputs in = inputs;
  if (in.bos_token.empty()) in.bos_token = bos_token;
  if (in.eos_token.empty()) in.eos_token = eos_token;
  return render_chat(tmpl, in, options);
}

std::optional<ModelChatTemplate> load_model_chat_template(const std::filesystem::path& model_dir, const Limits& limits) {
  const auto path = model_dir / "tokenizer_config.json";
  const auto jinja = model_dir / "chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::exists(jinja, ec)) {
    if (!std::filesystem::is_regular_file(jinja, ec))
      fail(ErrorCode::kCorruptFile, jinja.string(), ": not a regular file");
    const auto size = std::filesystem::file_size(jinja, ec);
    if (ec) fail(ErrorCode::kIo, jinja.string(), ": ", ec.message());
    if (size > kMaxChatTemplateBytes)
      fail(ErrorCode::kCorruptFile, jinja.string(), ": ", size, " bytes, more than a chat template may have (",
           kMaxChatTemplateBytes, ")");
    std::ifstream f(jinja, std::ios::binary);
    std::string source((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (!f.good() && !f.eof()) fail(ErrorCode::kIo, jinja.string(), ": cannot be read");
    nlohmann::json config = nlohmann::json::object();
    if (std::ifstream cfg(path); cfg) {
      try {
        config = parse_json_file(cfg, path.string());
      } catch (const nlohmann::json::parse_error& e) {
        fail(ErrorCode::kCorruptFile, path.string(), ": not valid JSON: ", e.what());
      }
    }
    if (!config.is_object()) fail(ErrorCode::kCorruptFile, path.string(), ": expected a JSON object");
    return ModelChatTemplate{compile_from(source, jinja, limits), special_token(config, "bos_token"),
                             special_token(config, "eos_token"), source};
  }
  std::ifstream in(path);
  if (!in) return std::nullopt;
  nlohmann::json config;
  try {
    config = parse_json_file(in, path.string());
  } catch (const nlohmann::json::parse_error& e) {
    fail(ErrorCode::kCorruptFile, path.string(), ": not valid JSON: ", e.what());
  }
  if (!config.is_object()) fail(ErrorCode::kCorruptFile, path.string(), ": expected a JSON object");
  std::string source;
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& entry : *it)
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") && entry["template"].is_string())
        source = entry["template"].get<std::string>();
    if (source.empty())
      fail(ErrorCode::kInvalidArgument, path.string(), ": chat_template is a list without a \"default\" entry");
  } else {
    fail(ErrorCode::kInvalidArgument, path.string(), ": chat_template must be a string or a list of {name, template}");
  }
  if (source.size() > kMaxChatTemplateBytes)
    fail(ErrorCode::kCorruptFile, path.string(), ": chat_template is ", source.size(),
         " bytes, more than a chat template may have (", kMaxChatTemplateBytes, ")");
  ModelChatTemplate out{compile_from(source, path, limits), special_token(config, "bos_token"), special_token(config, "eos_token"), source};
  return out;
}

}  // namespace shardlm::chat_template
