// OpenAI (and vLLM) request validation and response shapes. Pure functions
// over JSON: no sockets, so every rule is unit-testable.
#pragma once

#include <string>
#include <vector>

#include "server/serving_backend.h"

namespace shardlm::server {

enum class Endpoint { kChat, kCompletions };

// Limits that make hostile requests a 400 instead of a resource problem.
struct RequestLimits {
  int max_n = 16;                  // choices per request
  int max_stop_strings = 32;
  size_t max_stop_length = 256;    // bytes per stop string
  int max_top_logprobs = 20;
  int max_prompts = 64;            // list prompts in /v1/completions
};

// A validated request: one GenerateParams per prompt (completions accept a
// list of prompts), plus how to answer.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;  // as requested (empty: the served model)
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool echo = false;                    // completions: prepend the prompt text
  bool chat_logprobs = false;           // chat: logprobs=true
  std::vector<GenerateParams> prompts;  // one per prompt
  std::vector<std::string> prompt_texts;  // for echo
};

// Parses and validates a request body. Throws ApiException (400 with the
// offending `param` named) on any invalid value, using `backend` to render
// chat templates, tokenize and check the context length.
ParsedRequest parse_request(Endpoint endpoint, const std::string& body, const ServingBackend& backend,
                            const RequestLimits& limits = {});

// {"error": {"message", "type", "param", "code"}}
ordered_json error_json(const ApiError& error);

// Response ids: "chatcmpl-<hex>", "cmpl-<hex>".
std::string new_request_id(Endpoint endpoint);

// Accumulated output of one choice, for non-streaming responses.
struct ChoiceResult {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<std::vector<TopLogprob>> top_logprobs;
  std::vector<std::string> tokens;
  std::string finish_reason = "length";
};

ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// A whole (non-streaming) response.
ordered_json completion_response(const ParsedRequest& request, const std::string& id, int64_t created,
                                 const std::string& model, const std::vector<std::vector<ChoiceResult>>& choices,
                                 int64_t prompt_tokens, int64_t completion_tokens);

// One streaming chunk carrying `event` for choice `choice_index`.
ordered_json stream_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                          const std::string& model, int choice_index, const GenerateEvent& event, bool first);

// The final usage chunk (choices: []) when stream_options.include_usage.
ordered_json usage_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                         const std::string& model, int64_t prompt_tokens, int64_t completion_tokens);

}  // namespace shardlm::server
