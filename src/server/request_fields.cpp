#include "server/request_fields.h"

#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm::server {

namespace {

[[noreturn]] void refuse(const std::string& field, const std::string& message) {
  throw ApiException(ApiError{400, message, "invalid_request_error", field, "unsupported_parameter"});
}

// Implemented by parse_request, for both endpoints.
const std::set<std::string>& common_fields() {
  static const std::set<std::string> f = {
      "model", "stream", "stream_options", "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
      "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos",
      "skip_special_tokens", "logprobs", "max_tokens", "min_tokens", "logit_bias", "response_format",
      "structured_outputs", "guided_json", "guided_regex", "guided_choice",
      "cache_salt", "prompt_logprobs",
      // Metadata about the caller, with no effect on generation in OpenAI's API either.
      "user"};
  return f;
}

const std::set<std::string>& chat_fields() {
  static const std::set<std::string> f = {"messages", "top_logprobs", "max_completion_tokens", "tools", "tool_choice",
                                          "parallel_tool_calls", "chat_template_kwargs", "add_generation_prompt"};
  return f;
}

const std::set<std::string>& completion_fields() {
  static const std::set<std::string> f = {"prompt", "echo", "best_of", "suffix"};
  return f;
}

// Fields shardlm knows and does not implement (yet), with what to do instead.
const char* not_implemented(const std::string& field) {
  static const std::pair<const char*, const char*> list[] = {
      {"functions", "the legacy 'functions' parameter is not supported; send 'tools' instead"},
      {"function_call", "the legacy 'function_call' parameter is not supported; send 'tool_choice' instead"},
      {"guided_grammar", "'guided_grammar' is not supported"},
      {"audio", "audio output is not supported"},
      {"modalities", "only text output is supported; remove 'modalities'"},
      {"prediction", "predicted outputs ('prediction') are not supported"},
      {"web_search_options", "web search is not supported"},
      {"reasoning_effort", "'reasoning_effort' is not supported; for Qwen3 use chat_template_kwargs {\"enable_thinking\": false}"},
      {"use_beam_search", "beam search is not supported"},
      {"length_penalty", "'length_penalty' (beam search) is not supported"},
      {"include_stop_str_in_output", "'include_stop_str_in_output' is not supported"},
      {"continue_final_message", "'continue_final_message' is not supported"},
      {"documents", "'documents' is not supported"},
      {"chat_template", "a per-request 'chat_template' is not supported; the model's own template is used"},
      {"truncate_prompt_tokens", "'truncate_prompt_tokens' is not supported"},
      {"return_tokens_as_token_ids", "'return_tokens_as_token_ids' is not supported"},
      {"spaces_between_special_tokens", "'spaces_between_special_tokens' is not supported"},
      {"allowed_token_ids", "'allowed_token_ids' is not supported; use logit_bias"},
      {"bad_words", "'bad_words' is not supported; use logit_bias"},
      {"add_special_tokens", "'add_special_tokens' is only accepted by /tokenize"},
  };
  for (const auto& [name, message] : list)
    if (field == name) return message;
  return nullptr;
}

bool is_default(const ordered_json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0.0) ||
         (v.is_string() && v.get<std::string>().empty());
}

}  // namespace

void check_request_fields(Endpoint endpoint, const ordered_json& body) {
  const auto& own = endpoint == Endpoint::kChat ? chat_fields() : completion_fields();
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    const ordered_json& v = it.value();
    if (v.is_null()) continue;  // null means absent, as OpenAI and vLLM read it
    if (key == "best_of" && endpoint == Endpoint::kCompletions) {
      if (!v.is_null() && !(v.is_number_integer() && v.get<int64_t>() == 1))
        refuse(key, "'best_of' other than 1 is not supported; use 'n' and pick the best yourself");
      continue;
    }
    if (key == "suffix" && endpoint == Endpoint::kCompletions) {
      if (!is_default(v)) refuse(key, "'suffix' (insertion) is not supported");
      continue;
    }
    if (key == "priority") {
      if (!is_default(v)) refuse(key, "'priority' is not supported: requests are served first come, first served");
      continue;
    }
    if (key == "store") {
      if (!is_default(v)) refuse(key, "'store': true is not supported: shardlm keeps no completions");
      continue;
    }
    if (key == "metadata") {
      if (!v.is_null() && !(v.is_object() && v.empty())) refuse(key, "'metadata' is only used with 'store', which is not supported");
      continue;
    }
    if (key == "service_tier") {
      if (!v.is_null() && !(v.is_string() && (v == "auto" || v == "default")))
        refuse(key, "'service_tier' must be \"auto\" or \"default\": shardlm has one tier");
      continue;
    }
    if (common_fields().count(key) || own.count(key)) continue;
    if (const char* why = not_implemented(key)) refuse(key, why);
    const char* other = endpoint == Endpoint::kChat ? "/v1/completions" : "/v1/chat/completions";
    if ((endpoint == Endpoint::kChat ? completion_fields() : chat_fields()).count(key))
      refuse(key, str_cat("'", key, "' is a parameter of ", other, ", not of this endpoint"));
    refuse(key, str_cat("Unrecognized request argument supplied: '", key, "'"));
  }
}

}  // namespace shardlm::server
