// OpenAI (and vLLM) request validation and response shapes. Pure functions
// over JSON: no sockets, so every rule is unit-testable.
#pragma once

#include <string>
#include <vector>

#include "server/chat_output.h"
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
  int max_logit_bias = 1024;       // entries in logit_bias
};

// How chat outputs are parsed and defaults chosen (serve's flags).
struct ApiOptions {
  std::string tool_call_parser;     // --tool-call-parser; "": detected from the chat template
  std::string reasoning_parser;     // --reasoning-parser; "": none
  bool generation_config = true;    // --generation-config auto: generation_config.json's sampling defaults
  bool check_fields = true;         // refuse unknown / unimplemented request fields (off for /tokenize)
};

// A validated request: one GenerateParams per prompt (completions accept a
// list of prompts), plus how to answer.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;  // as requested (empty: the served model)
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage = false;        // stream_options.continuous_usage_stats: usage on every chunk (vLLM)
  bool echo = false;                    // completions: prepend the prompt text
  bool chat_logprobs = false;           // chat: logprobs=true
  // vLLM's prompt_logprobs as the client sent it (-1: absent): the response
  // carries them (completions: per choice; chat: beside the choices). The
  // backend's GenerateParams::prompt_logprobs may be larger: echo with
  // logprobs needs the prompt's logprobs too.
  int prompt_logprobs = -1;
  std::vector<GenerateParams> prompts;  // one per prompt
  std::vector<std::string> prompt_texts;  // for echo
  ChatOutputOptions output;             // chat: reasoning and tool-call parsing of each choice
};

// Parses and validates a request body. Throws ApiException (400 with the
// offending `param` named) on any invalid value, using `backend` to render
// chat templates, tokenize and check the context length.
ParsedRequest parse_request(Endpoint endpoint, const std::string& body, const ServingBackend& backend,
                            const RequestLimits& limits = {}, const ApiOptions& api = {});
// The same over a body already parsed (parse_bounded_json): the HTTP layer
// parses each body once.
ParsedRequest parse_request(Endpoint endpoint, ordered_json body, const ServingBackend& backend,
                            const RequestLimits& limits = {}, const ApiOptions& api = {});

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
  std::vector<PromptTokenLogprob> prompt_logprobs;  // [n_prompt], on choice 0 of a prompt (GenerateEvent's)
  std::string finish_reason = "length";
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, served by the prefix cache
};
ordered_json usage_json(const Usage& usage);

// A whole (non-streaming) response. Chat choices go through the request's
// reasoning and tool-call parsers.
ordered_json completion_response(const ParsedRequest& request, const std::string& id, int64_t created,
                                 const std::string& model, const std::vector<std::vector<ChoiceResult>>& choices,
                                 const Usage& usage);

// The streaming chunks for `event` of choice `choice_index` (none when a
// parser holds all of its text back). A chat choice's `first` event is
// preceded by a role-only chunk, delta {"role": "assistant", "content": ""};
// completions chunks carry no role. `usage`: the choice's usage so far,
// given to every chunk when request.continuous_usage. `parser`: that choice's output parser
// (chat), null for completions; make one per choice with make_output_parser.
std::vector<ordered_json> stream_chunks(const ParsedRequest& request, const std::string& id, int64_t created,
                                        const std::string& model, int choice_index, const GenerateEvent& event,
                                        bool first, ChatOutputParser* parser, const Usage* usage = nullptr);
std::unique_ptr<ChatOutputParser> make_output_parser(const ParsedRequest& request);

// The final usage chunk (choices: []) when stream_options.include_usage.
ordered_json usage_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                         const std::string& model, const Usage& usage);

}  // namespace shardlm::server
