// The boundary between the HTTP layer and whatever generates tokens. The
// server validates OpenAI requests into GenerateParams, hands them to a
// ServingBackend and relays its events; the engine adapter implements it over
// the real engine, tests implement it with scripted tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <utility>

#include <nlohmann/json_fwd.hpp>

#include "server/deployment.h"

namespace shardlm {
class Arrivals;  // engine/arrivals.h
}  // namespace shardlm

namespace shardlm::grammar {
class CompiledGrammar;
struct GrammarSpec;
}  // namespace shardlm::grammar

namespace shardlm::server {

using ordered_json = nlohmann::ordered_json;

// An error that becomes an OpenAI-shaped JSON body with this HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty -> null
  std::string code;   // empty -> null
};

class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError error) : error_(std::move(error)) {}
  const ApiError& error() const { return error_; }
  const char* what() const noexcept override { return error_.message.c_str(); }

 private:
  ApiError error_;
};

// One generation request, validated. Mirrors vLLM's SamplingParams.
struct GenerateParams {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  int n = 1;                       // independent completions of the prompt
  int64_t max_tokens = 16;
  int64_t min_tokens = 0;
  double temperature = 1.0;        // 0 = greedy
  double top_p = 1.0;
  int64_t top_k = -1;              // -1 = off
  double min_p = 0.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;   // stop strings, excluded from the output text
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  int logprobs = -1;               // -1: none; k >= 0: chosen token's logprob + top-k
  int prompt_logprobs = -1;        // -1: none; k >= 0: every prompt token's logprob, rank + top-k (vLLM's)
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]) added to its logit
  std::shared_ptr<const grammar::CompiledGrammar> grammar;  // structured output; null: unconstrained
  std::string cache_salt;          // vLLM's cache_salt: prefix-cache blocks shared only with the same salt
};

// generation_config.json's sampling values, which vLLM's
// `--generation-config auto` makes the defaults of every request.
struct SamplingDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_tokens;  // max_new_tokens
};

struct TopLogprob {
  int32_t token_id = 0;
  std::string token;  // decoded text of the token
  float logprob = 0.0f;
};

// One prompt token as vLLM's prompt_logprobs reports it. Entry 0 of a
// prompt has nothing before it: scored = false, only token_id and token.
struct PromptTokenLogprob {
  int32_t token_id = 0;
  std::string token;               // decoded text of the token
  bool scored = false;
  float logprob = 0.0f;            // log_softmax of the model's logits at the previous position
  int32_t rank = 0;                // 1 = the most likely token (ties counted as vLLM counts them)
  std::vector<TopLogprob> top;     // the most likely tokens there, most likely first: top[i] has rank i + 1
};

// What the backend reports as a request progresses. One event may carry
// several tokens; finish_reason is set on the last event of a choice.
struct GenerateEvent {
  int index = 0;                      // which of the n choices
  std::string text;                   // new text (stop strings removed)
  std::vector<int32_t> token_ids;     // new tokens
  std::vector<float> logprobs;        // per new token, when requested
  std::vector<std::vector<TopLogprob>> top_logprobs;  // per new token
  std::vector<std::string> tokens;    // per new token, decoded text (for logprobs)
  // [n_prompt] when params.prompt_logprobs >= 0, on the first event of
  // choice 0 only (the choices share one prompt).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  std::optional<std::string> finish_reason;  // "stop", "length", "abort"
  std::optional<std::string> stop_string;    // with "stop": the stop string that ended it (Anthropic's stop_sequence)
  std::string error;                  // non-empty: the request failed
};

// A request in flight. The HTTP thread polls it; cancel() (client gone)
// frees its sequences and KV blocks at once.
class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Waits up to `timeout` for events; returns false on timeout.
  virtual bool next(std::vector<GenerateEvent>* events, std::chrono::milliseconds timeout) = 0;
  // True once every choice has finished and all events were taken.
  virtual bool done() const = 0;
  virtual void cancel() = 0;
  virtual int64_t prompt_tokens() const = 0;
  virtual int64_t completion_tokens() const = 0;
  // Prompt tokens the prefix cache served (usage.prompt_tokens_details).
  virtual int64_t cached_tokens() const { return 0; }
};

class ServingBackend {
 public:
  virtual ~ServingBackend() = default;
  // False while the model is loading: requests get 503.
  virtual bool ready() const = 0;
  // Empty while the backend can serve; else why not, naming the failed rank
  // and its error: /health answers 503 with it, new requests get 503.
  virtual std::string health_error() const { return {}; }
  // Down for good (a failure it cannot recover from): the process should
  // exit non-zero with health_error() so that a supervisor restarts it.
  virtual bool fatal() const { return false; }
  virtual int64_t max_model_len() const = 0;
  virtual std::vector<int32_t> tokenize(const std::string& text, bool add_special_tokens) const = 0;
  virtual std::string detokenize(const std::vector<int32_t>& ids) const = 0;
  // Each id's vocabulary string as the tokenizer stores it ("Ġworld",
  // "▁Hello", "<0xF0>"): transformers' convert_ids_to_tokens, what vLLM's
  // /tokenize return_token_strs gives. Throws ApiException(400) for an id
  // the tokenizer does not have.
  virtual std::vector<std::string> token_strings(const std::vector<int32_t>& ids) const = 0;
  // Renders the model's chat template. Throws ApiException(400) for a
  // template error caused by the messages.
  virtual std::string render_chat(const ordered_json& messages, const ordered_json& tools,
                                  bool add_generation_prompt, const ordered_json& template_kwargs) const = 0;
  // Starts a request. Throws ApiException(429) when the waiting queue is
  // full, ApiException(400) when it cannot ever fit.
  virtual std::unique_ptr<RequestStream> submit(const GenerateParams& params) = 0;
  // Compiles a structured-output grammar for this model's vocabulary.
  // Throws ApiException(400) naming what the grammar engine does not
  // support; the default (a backend without one) refuses every grammar.
  virtual std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const grammar::GrammarSpec& spec) const;
  // Prometheus text for GET /metrics.
  virtual std::string metrics() const = 0;
  // The chat template's source, from which the tool-call format is detected.
  virtual std::string chat_template_source() const { return ""; }
  // Token ids are < vocab_size (0: unknown; logit_bias ids are then unchecked).
  virtual int64_t vocab_size() const { return 0; }
  virtual SamplingDefaults sampling_defaults() const { return {}; }
  // The layout and per-rank memory, planned and measured (GET /v1/deployment);
  // available = false for a backend that cannot describe itself.
  virtual Deployment deployment() const { return {}; }
  // Where the HTTP server announces requests on their way to this backend's
  // engines (engine/arrivals.h: burst admission); null: none is wanted.
  virtual std::shared_ptr<Arrivals> arrivals() const { return nullptr; }
};

}  // namespace shardlm::server
