#include "server/openai_protocol.h"
#include "server/structured_output.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/bounded_json.h"
#include "server/qwen3_coder_tool_parser.h"
#include "server/request_fields.h"
#include "server/tool_request.h"

namespace shardlm::server {

namespace {

[[noreturn]] void bad_request(const std::string& param, const std::string& message) {
  throw ApiException(ApiError{400, message, "invalid_request_error", param, ""});
}

const ordered_json* find(const ordered_json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number_param(const ordered_json& body, const char* key, double fallback, double lo, double hi,
                    bool lo_open = false) {
  const ordered_json* v = find(body, key);
  if (!v) return fallback;
  if (!v->is_number()) bad_request(key, str_cat("'", key, "' must be a number, got ", brief_json(*v)));
  double x = v->get<double>();
  bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (below || !(x <= hi) || std::isnan(x))
    bad_request(key, str_cat("'", key, "' must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", brief_json(*v)));
  return x;
}

int64_t int_param(const ordered_json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi) {
  const ordered_json* v = find(body, key);
  if (!v) return fallback;
  // Accept 3.0 as 3 (some clients serialise integers as floats), nothing fractional.
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::floor(d) != d || std::abs(d) > 9e15) bad_request(key, str_cat("'", key, "' must be an integer, got ", brief_json(*v)));
    int64_t i = static_cast<int64_t>(d);
    if (i < lo || i > hi) bad_request(key, str_cat("'", key, "' must be between ", lo, " and ", hi, ", got ", brief_json(*v)));
    return i;
  }
  if (!v->is_number_integer()) bad_request(key, str_cat("'", key, "' must be an integer, got ", brief_json(*v)));
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad_request(key, str_cat("'", key, "' must be between ", lo, " and ", hi, ", got ", brief_json(*v)));
  int64_t i = v->get<int64_t>();
  if (i < lo || i > hi) bad_request(key, str_cat("'", key, "' must be between ", lo, " and ", hi, ", got ", brief_json(*v)));
  return i;
}

// top_logprobs / logprobs: at most serve's --max-logprobs (vLLM's flag and default, 20).
int64_t logprobs_param(const ordered_json& body, const char* key, int64_t fallback, int max) {
  const ordered_json* v = find(body, key);
  if (v && v->is_number() && !v->is_number_float() && v->get<int64_t>() > max)
    bad_request(key, str_cat("'", key, "' must be between 0 and ", max, ", got ", brief_json(*v),
                             " (the server's --max-logprobs)"));
  return int_param(body, key, fallback, 0, max);
}

bool bool_param(const ordered_json& body, const char* key, bool fallback) {
  const ordered_json* v = find(body, key);
  if (!v) return fallback;
  if (!v->is_boolean()) bad_request(key, str_cat("'", key, "' must be true or false, got ", brief_json(*v)));
  return v->get<bool>();
}

// Chat message content: a string, null, or a list of {"type": "text", "text": ...} parts.
ordered_json normalise_messages(const ordered_json& messages) {
  if (!messages.is_array()) bad_request("messages", "'messages' must be a list of message objects");
  if (messages.empty()) bad_request("messages", "'messages' must contain at least one message");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = str_cat("messages[", i, "]");
    if (!m.is_object()) bad_request(where, where + " must be an object with 'role' and 'content'");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad_request(where + ".role", where + ".role must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      bad_request(where + ".role", str_cat(where, ".role must be one of system, user, assistant, tool, developer; got '", r, "'"));
    ordered_json copy = m;
    auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      std::string text;
      for (const auto& part : *content) {
        if (!part.is_object() || string_field(part, "type") != "text" || !part.contains("text") || !part["text"].is_string())
          bad_request(where + ".content", str_cat(where, ".content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported"));
        text += part["text"].get<std::string>();
      }
      copy["content"] = text;
    } else if (content != m.end() && !content->is_string() && !content->is_null()) {
      bad_request(where + ".content", where + ".content must be a string, a list of text parts, or null");
    } else if (content == m.end() && r != "assistant") {
      bad_request(where + ".content", where + ".content is required");
    }
    normalise_tool_fields(&copy, where);
    out.push_back(std::move(copy));
  }
  return out;
}

std::vector<std::string> stop_param(const ordered_json& body, const RequestLimits& limits) {
  const ordered_json* v = find(body, "stop");
  std::vector<std::string> out;
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (static_cast<int>(v->size()) > limits.max_stop_strings)
      bad_request("stop", str_cat("'stop' may hold at most ", limits.max_stop_strings, " strings (--max-stop-strings), got ", v->size()));
    for (const auto& s : *v) {
      if (!s.is_string()) bad_request("stop", "'stop' must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad_request("stop", "'stop' must be a string or a list of strings");
  }
  for (const auto& s : out) {
    if (s.empty()) bad_request("stop", "'stop' strings must not be empty");
    if (s.size() > limits.max_stop_length)
      bad_request("stop", str_cat("'stop' strings may be at most ", limits.max_stop_length, " bytes (--max-stop-length), got one of ", s.size()));
  }
  return out;
}

// Prompt token lists for /v1/completions: a string, a list of strings, a list
// of token ids, or a list of lists of token ids.
std::vector<std::vector<int32_t>> completion_prompts(const ordered_json& body, const ServingBackend& backend,
                                                     const RequestLimits& limits, std::vector<std::string>* texts) {
  const ordered_json* p = find(body, "prompt");
  if (!p) bad_request("prompt", "'prompt' is required");
  std::vector<std::vector<int32_t>> out;
  auto ids_from = [&](const ordered_json& list) {
    std::vector<int32_t> ids;
    for (const auto& t : list) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        bad_request("prompt", "token ids in 'prompt' must be non-negative integers");
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return ids;
  };
  if (p->is_string()) {
    out.push_back(backend.tokenize(p->get<std::string>(), true));
    texts->push_back(p->get<std::string>());
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    out.push_back(ids_from(*p));
    texts->push_back(backend.detokenize(out.back()));
  } else if (p->is_array() && !p->empty()) {
    if (static_cast<int>(p->size()) > limits.max_prompts)
      bad_request("prompt", str_cat("'prompt' may hold at most ", limits.max_prompts, " prompts (--max-prompts), got ", p->size()));
    for (const auto& item : *p) {
      if (item.is_string()) {
        out.push_back(backend.tokenize(item.get<std::string>(), true));
        texts->push_back(item.get<std::string>());
      } else if (item.is_array()) {
        out.push_back(ids_from(item));
        texts->push_back(backend.detokenize(out.back()));
      } else {
        bad_request("prompt", "'prompt' must be a string, a list of strings, or token ids");
      }
    }
  } else {
    bad_request("prompt", "'prompt' must be a non-empty string, list of strings, or token ids");
  }
  for (const auto& ids : out)
    if (ids.empty()) bad_request("prompt", "'prompt' must not be empty");
  return out;
}

// logit_bias: {"token id": bias}, ids in the vocabulary, biases in [-100, 100].
std::vector<std::pair<int32_t, float>> logit_bias_param(const ordered_json& body, const ServingBackend& backend,
                                                        const RequestLimits& limits) {
  std::vector<std::pair<int32_t, float>> out;
  const ordered_json* v = find(body, "logit_bias");
  if (!v) return out;
  if (!v->is_object()) bad_request("logit_bias", "'logit_bias' must be an object mapping token ids (as strings) to biases");
  if (static_cast<int>(v->size()) > limits.max_logit_bias)
    bad_request("logit_bias", str_cat("'logit_bias' may hold at most ", limits.max_logit_bias, " entries (--max-logit-bias), got ", v->size()));
  const int64_t vocab = backend.vocab_size();
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    char* end = nullptr;
    errno = 0;
    long long id = std::strtoll(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > INT32_MAX || (vocab > 0 && id >= vocab))
      bad_request("logit_bias", vocab > 0 ? str_cat("'logit_bias' key '", key, "' must be a token id in [0, ", vocab - 1,
                                                    "]: the vocabulary has ", vocab, " tokens")
                                          : str_cat("'logit_bias' key '", key, "' must be a non-negative token id"));
    if (!it.value().is_number() || !(it.value().get<double>() >= -100.0 && it.value().get<double>() <= 100.0))
      bad_request("logit_bias", str_cat("'logit_bias' value for token ", key, " must be a number in [-100, 100], got ",
                                        brief_json(it.value())));
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(it.value().get<double>()));
  }
  return out;
}

}  // namespace

ParsedRequest parse_request(Endpoint endpoint, const std::string& text, const ServingBackend& backend,
                            const RequestLimits& limits, const ApiOptions& api) {
  return parse_request(endpoint, parse_bounded_json(text, "the request body"), backend, limits, api);
}

ParsedRequest parse_request(Endpoint endpoint, ordered_json body, const ServingBackend& backend,
                            const RequestLimits& limits, const ApiOptions& api) {
  if (!body.is_object()) bad_request("", "the request body must be a JSON object");
  if (api.check_fields) check_request_fields(endpoint, body);
  const SamplingDefaults defaults = api.generation_config ? backend.sampling_defaults() : SamplingDefaults{};

  ParsedRequest req;
  req.endpoint = endpoint;
  if (const ordered_json* m = find(body, "model")) {
    if (!m->is_string()) bad_request("model", "'model' must be a string");
    req.model = m->get<std::string>();
  }
  req.stream = bool_param(body, "stream", false);
  if (const ordered_json* so = find(body, "stream_options")) {
    if (!so->is_object()) bad_request("stream_options", "'stream_options' must be an object");
    if (!req.stream) bad_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
    for (auto it = so->begin(); it != so->end(); ++it)
      if (it.key() != "include_usage" && it.key() != "continuous_usage_stats" && !it.value().is_null())
        bad_request("stream_options." + it.key(), str_cat("'stream_options.", it.key(), "' is not supported"));
    req.include_usage = bool_param(*so, "include_usage", false);
    req.continuous_usage = bool_param(*so, "continuous_usage_stats", false);
    if (req.continuous_usage && !req.include_usage)
      bad_request("stream_options.continuous_usage_stats",
                  "'stream_options.continuous_usage_stats' needs 'stream_options.include_usage': true");
  }

  GenerateParams base;
  bool forced_tool_call = false;  // tool_choice required / named: the grammar writes hermes blocks
  // Structured output (server/structured_output.h): compiled once per request.
  std::string grammar_param;
  if (std::optional<grammar::GrammarSpec> spec = parse_structured_output(body, &grammar_param)) {
    try {
      base.grammar = backend.compile_grammar(*spec);
    } catch (const ApiException& e) {
      ApiError error = e.error();  // name the parameter the client actually sent
      error.param = grammar_param;
      throw ApiException(std::move(error));
    }
    forced_tool_call = spec->kind == grammar::GrammarSpec::Kind::kToolCalls;
  }
  if (const ordered_json* nv = find(body, "n"); nv && nv->is_number() && nv->get<double>() > limits.max_n)
    bad_request("n", str_cat("'n' may be at most ", limits.max_n, " (choices per request, the server's --max-n), got ", brief_json(*nv)));
  base.n = static_cast<int>(int_param(body, "n", 1, 1, limits.max_n));
  // Request values win over generation_config.json's, which win over OpenAI's.
  base.temperature = number_param(body, "temperature", defaults.temperature.value_or(1.0), 0.0, 2.0);
  base.top_p = number_param(body, "top_p", defaults.top_p.value_or(1.0), 0.0, 1.0, /*lo_open=*/true);
  base.top_k = int_param(body, "top_k", defaults.top_k.value_or(-1), -1, INT32_MAX);
  if (base.top_k == 0) base.top_k = -1;  // vLLM: 0 also means off
  base.min_p = number_param(body, "min_p", defaults.min_p.value_or(0.0), 0.0, 1.0);
  base.presence_penalty = number_param(body, "presence_penalty", 0.0, -2.0, 2.0);
  base.frequency_penalty = number_param(body, "frequency_penalty", 0.0, -2.0, 2.0);
  base.repetition_penalty =
      number_param(body, "repetition_penalty", defaults.repetition_penalty.value_or(1.0), 0.0, 2.0, /*lo_open=*/true);
  base.logit_bias = logit_bias_param(body, backend, limits);
  if (find(body, "seed")) base.seed = int_param(body, "seed", 0, INT64_MIN, INT64_MAX);
  if (const ordered_json* salt = find(body, "cache_salt")) {
    if (!salt->is_string() || salt->get_ref<const std::string&>().empty() || salt->get_ref<const std::string&>().size() > 1024)
      bad_request("cache_salt", "'cache_salt' must be a non-empty string of at most 1,024 bytes");
    base.cache_salt = salt->get<std::string>();
  }
  base.stop = stop_param(body, limits);
  if (const ordered_json* st = find(body, "stop_token_ids")) {
    if (!st->is_array() || static_cast<int>(st->size()) > limits.max_stop_strings)
      bad_request("stop_token_ids", str_cat("'stop_token_ids' must be a list of at most ", limits.max_stop_strings, " token ids (--max-stop-strings)"));
    for (const auto& t : *st) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        bad_request("stop_token_ids", "'stop_token_ids' must hold non-negative integers");
      base.stop_token_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
  base.ignore_eos = bool_param(body, "ignore_eos", false);
  base.skip_special_tokens = bool_param(body, "skip_special_tokens", true);
  if (endpoint == Endpoint::kChat) {
    req.chat_logprobs = bool_param(body, "logprobs", false);
    int64_t top = logprobs_param(body, "top_logprobs", 0, limits.max_top_logprobs);
    if (find(body, "top_logprobs") && !req.chat_logprobs)
      bad_request("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    base.logprobs = req.chat_logprobs ? static_cast<int>(top) : -1;
  } else {
    base.logprobs = find(body, "logprobs") ? static_cast<int>(logprobs_param(body, "logprobs", 0, limits.max_top_logprobs)) : -1;
    req.echo = bool_param(body, "echo", false);
    // With echo, the legacy logprobs object covers the prompt's tokens first:
    // their logprobs come from the prefill (prompt_logprobs below).
    // Streamed, the prompt's logprobs arrive with choice 0's first token:
    // with n > 1 a sibling's first chunk could come before them.
    if (req.echo && base.logprobs >= 0 && req.stream && base.n > 1)
      bad_request("echo", "'echo' with 'logprobs' and 'n' > 1 is not supported when streaming; send \"stream\": false "
                          "or \"n\": 1");
  }
  // vLLM's prompt_logprobs: an integer in [0, --max-logprobs].
  if (find(body, "prompt_logprobs")) {
    req.prompt_logprobs = static_cast<int>(logprobs_param(body, "prompt_logprobs", -1, limits.max_top_logprobs));
    if (req.stream)
      bad_request("prompt_logprobs", "'prompt_logprobs' is not available when streaming (as in vLLM); send \"stream\": false");
  }
  base.prompt_logprobs = req.prompt_logprobs;
  if (req.echo && base.logprobs >= 0) base.prompt_logprobs = std::max(base.prompt_logprobs, base.logprobs);

  // Prompts.
  std::vector<std::vector<int32_t>> prompts;
  if (endpoint == Endpoint::kChat) {
    const ordered_json* messages = find(body, "messages");
    if (!messages) bad_request("messages", "'messages' is required");
    ordered_json normalised = normalise_messages(*messages);
    ordered_json tools = validate_tools(find(body, "tools"));
    const ToolChoice choice = parse_tool_choice(find(body, "tool_choice"), tools);
    req.output.parallel_tool_calls = bool_param(body, "parallel_tool_calls", true);
    // "required" and a named function are enforced by the grammar that
    // parse_structured_output built (hermes <tool_call> blocks); the output
    // parser below turns them into message.tool_calls.
    if (choice.mode == ToolChoice::Mode::kNone) {
      tools = ordered_json();  // not rendered, not parsed
    } else {
      req.output.tool_call_parser =
          api.tool_call_parser.empty() ? detect_tool_call_parser(backend.chat_template_source()) : api.tool_call_parser;
      // A forced call is written by our grammar in hermes syntax, whatever the template says.
      if (forced_tool_call) req.output.tool_call_parser = "hermes";
      req.output.forced_tool_call = forced_tool_call;
      if (req.output.tool_call_parser.empty())
        bad_request("tools", "this model's chat template has no tool-call format shardlm recognises; start the server with "
                             "--tool-call-parser hermes (Qwen2.5/Qwen3), llama3_json (Llama 3.1) or qwen3_coder "
                             "(Qwen3-Coder), or send tool_choice \"none\"");
      req.output.parameter_types = tool_parameter_types(tools);
    }
    ordered_json kwargs = ordered_json::object();
    if (const ordered_json* k = find(body, "chat_template_kwargs")) {
      if (!k->is_object()) bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      // The variables shardlm sets (chat_context) and the template's builtins:
      // overriding messages would bypass the role checks above.
      static const char* const kReserved[] = {"messages",  "tools",     "documents",       "add_generation_prompt",
                                              "bos_token", "eos_token", "raise_exception", "strftime_now"};
      for (const char* name : kReserved)
        if (k->contains(name))
          bad_request("chat_template_kwargs", str_cat("chat_template_kwargs may not set '", name,
                                                      "': shardlm sets it (send it as a request field, if it is one)"));
      kwargs = *k;
    }
    bool add_generation_prompt = bool_param(body, "add_generation_prompt", true);
    std::string rendered = backend.render_chat(normalised, tools, add_generation_prompt, kwargs);
    prompts.push_back(backend.tokenize(rendered, false));
    req.output.reasoning_parser = api.reasoning_parser;
    req.output.starts_in_reasoning = !api.reasoning_parser.empty() && prompt_opens_reasoning(rendered);
    req.prompt_texts.push_back(rendered);
  } else {
    prompts = completion_prompts(body, backend, limits, &req.prompt_texts);
  }

  const int64_t max_len = backend.max_model_len();
  const bool has_max_tokens = find(body, "max_tokens") || find(body, "max_completion_tokens");
  const char* max_key = find(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  int64_t requested_max = int_param(body, max_key, -1, 1, INT64_MAX / 4);
  for (auto& ids : prompts) {
    GenerateParams p = base;
    p.prompt_ids = std::move(ids);
    const int64_t n_prompt = static_cast<int64_t>(p.prompt_ids.size());
    const char* what = endpoint == Endpoint::kChat ? "messages" : "prompt";
    if (n_prompt >= max_len)
      bad_request(what, str_cat("This model's maximum context length is ", max_len, " tokens. However, your ", what,
                                " resulted in ", n_prompt, " tokens. Please reduce the length of the ", what, "."));
    if (has_max_tokens) {
      p.max_tokens = requested_max;
    } else {
      p.max_tokens = endpoint == Endpoint::kChat ? max_len - n_prompt : std::min<int64_t>(16, max_len - n_prompt);
      if (defaults.max_tokens) p.max_tokens = std::min(*defaults.max_tokens, max_len - n_prompt);
    }
    if (n_prompt + p.max_tokens > max_len)
      bad_request(max_key, str_cat("This model's maximum context length is ", max_len, " tokens. However, you requested ",
                                   n_prompt + p.max_tokens, " tokens (", n_prompt, " in the ", what, ", ", p.max_tokens,
                                   " in the completion). Please reduce the length of the ", what, " or completion."));
    p.min_tokens = int_param(body, "min_tokens", 0, 0, p.max_tokens);
    req.prompts.push_back(std::move(p));
  }
  return req;
}

ordered_json error_json(const ApiError& error) {
  ordered_json e;
  e["message"] = error.message;
  e["type"] = error.type;
  e["param"] = error.param.empty() ? ordered_json() : ordered_json(error.param);
  e["code"] = error.code.empty() ? ordered_json(error.status) : ordered_json(error.code);
  return ordered_json{{"error", e}};
}

std::string new_request_id(Endpoint endpoint) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^ static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t x = salt + 0x9e3779b97f4a7c15ull * (++counter);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return std::string(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + buf;
}

ordered_json usage_json(const Usage& u) {
  return ordered_json{{"prompt_tokens", u.prompt_tokens},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens},
                      {"completion_tokens", u.completion_tokens},
                      {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {

ordered_json bytes_of(const std::string& s) {
  ordered_json b = ordered_json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}
ordered_json chat_logprobs(const std::vector<std::string>& tokens, const std::vector<float>& logprobs,
                           const std::vector<std::vector<TopLogprob>>& tops) {
  ordered_json content = ordered_json::array();
  for (size_t i = 0; i < logprobs.size(); ++i) {
    ordered_json item;
    std::string tok = i < tokens.size() ? tokens[i] : "";
    item["token"] = tok;
    item["logprob"] = logprobs[i];
    item["bytes"] = bytes_of(tok);
    ordered_json top = ordered_json::array();
    if (i < tops.size())
      for (const auto& t : tops[i]) top.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", bytes_of(t.token)}});
    item["top_logprobs"] = top;
    content.push_back(item);
  }
  return ordered_json{{"content", content}};
}

// Completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
// one entry per token, appended in order; text_offset counts bytes of the
// tokens' texts from `text_offset` (the echoed prompt's length, or 0 when the
// prompt's own tokens come first).
class LegacyLogprobs {
 public:
  explicit LegacyLogprobs(size_t text_offset) : offset_(text_offset) {}
  // A token without a logprob (the prompt's first): null logprob and top.
  void add_unscored(const std::string& tok) { add(tok, ordered_json(), ordered_json()); }
  // top: the n most likely (most likely first); the legacy API always
  // includes the token itself (so logprobs: 0 gives it alone, and N up to
  // N + 1 entries), as OpenAI and vLLM do.
  void add_scored(const std::string& tok, float logprob, const std::vector<TopLogprob>& top, size_t n) {
    ordered_json t = ordered_json::object();
    for (size_t i = 0; i < top.size() && i < n; ++i) t[top[i].token] = top[i].logprob;
    if (!t.contains(tok)) t[tok] = logprob;
    add(tok, logprob, t);
  }
  ordered_json json() const {
    return ordered_json{{"tokens", tokens_}, {"token_logprobs", logprobs_}, {"top_logprobs", top_}, {"text_offset", offsets_}};
  }

 private:
  void add(const std::string& tok, ordered_json logprob, ordered_json top) {
    tokens_.push_back(tok);
    logprobs_.push_back(std::move(logprob));
    top_.push_back(std::move(top));
    offsets_.push_back(offset_);
    offset_ += tok.size();
  }
  ordered_json tokens_ = ordered_json::array(), logprobs_ = ordered_json::array(), top_ = ordered_json::array(),
               offsets_ = ordered_json::array();
  size_t offset_;
};

ordered_json completion_logprobs(const std::vector<std::string>& tokens, const std::vector<float>& logprobs,
                                 const std::vector<std::vector<TopLogprob>>& tops, size_t text_offset,
                                 LegacyLogprobs* prefix = nullptr) {
  LegacyLogprobs out = prefix ? *prefix : LegacyLogprobs(text_offset);
  static const std::vector<TopLogprob> kNone;
  for (size_t i = 0; i < logprobs.size(); ++i)
    out.add_scored(i < tokens.size() ? tokens[i] : "", logprobs[i], i < tops.size() ? tops[i] : kNone, SIZE_MAX);
  return out.json();
}

// echo with logprobs: the prompt's tokens (the first unscored), then the
// generated ones, text offsets counted from the start of the prompt.
ordered_json echo_completion_logprobs(const std::vector<PromptTokenLogprob>& prompt, const ChoiceResult& c, int n_top) {
  LegacyLogprobs out(0);
  for (const PromptTokenLogprob& p : prompt) {
    if (p.scored) {
      out.add_scored(p.token, p.logprob, p.top, static_cast<size_t>(std::max(0, n_top)));
    } else {
      out.add_unscored(p.token);
    }
  }
  return completion_logprobs(c.tokens, c.logprobs, c.top_logprobs, 0, &out);
}

// vLLM's prompt_logprobs: [null, {"<token id>": {"logprob", "rank",
// "decoded_token"}, ...}, ...]: the prompt token itself first, then the
// n_top most likely at that position (ranks 1..n_top).
ordered_json prompt_logprobs_json(const std::vector<PromptTokenLogprob>& prompt, int n_top) {
  ordered_json list = ordered_json::array();
  for (const PromptTokenLogprob& p : prompt) {
    if (!p.scored) {
      list.push_back(nullptr);
      continue;
    }
    ordered_json d = ordered_json::object();
    d[std::to_string(p.token_id)] = {{"logprob", p.logprob}, {"rank", p.rank}, {"decoded_token", p.token}};
    for (size_t i = 0; i < p.top.size() && static_cast<int>(i) < n_top; ++i) {
      const std::string key = std::to_string(p.top[i].token_id);
      if (d.contains(key)) continue;
      d[key] = {{"logprob", p.top[i].logprob}, {"rank", static_cast<int>(i) + 1}, {"decoded_token", p.top[i].token}};
    }
    list.push_back(std::move(d));
  }
  return list;
}

bool wants_logprobs(const ParsedRequest& r) { return !r.prompts.empty() && r.prompts[0].logprobs >= 0; }

}  // namespace

namespace {

ordered_json tool_call_json(const ToolCall& c) {
  return ordered_json{{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

ordered_json chat_message_json(const ParsedRequest& request, const std::string& text) {
  ChatMessage m = parse_chat_output(request.output, text);
  ordered_json msg = {{"role", "assistant"}};
  msg["content"] = m.content.empty() && !m.tool_calls.empty() ? ordered_json() : ordered_json(m.content);
  if (!request.output.reasoning_parser.empty()) {
    ordered_json r = m.reasoning.empty() ? ordered_json() : ordered_json(m.reasoning);
    msg["reasoning_content"] = r;  // vLLM's name
    msg["reasoning"] = r;          // the name newer clients read
  }
  if (!m.tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& c : m.tool_calls) calls.push_back(tool_call_json(c));
    msg["tool_calls"] = calls;
  }
  return msg;
}

}  // namespace

ordered_json completion_response(const ParsedRequest& request, const std::string& id, int64_t created,
                                 const std::string& model, const std::vector<std::vector<ChoiceResult>>& choices,
                                 const Usage& usage) {
  ordered_json out;
  const bool chat = request.endpoint == Endpoint::kChat;
  out["id"] = id;
  out["object"] = chat ? "chat.completion" : "text_completion";
  out["created"] = created;
  out["model"] = model;
  ordered_json list = ordered_json::array();
  int index = 0;
  static const std::vector<PromptTokenLogprob> kNoPrompt;
  // The choices of prompt p share its prompt logprobs, which came with choice 0.
  auto prompt_of = [&](size_t p) -> const std::vector<PromptTokenLogprob>& {
    return p < choices.size() && !choices[p].empty() ? choices[p][0].prompt_logprobs : kNoPrompt;
  };
  for (size_t p = 0; p < choices.size(); ++p) {
    for (const ChoiceResult& c : choices[p]) {
      ordered_json choice;
      choice["index"] = index++;
      std::string finish = c.finish_reason;
      if (chat) {
        choice["message"] = chat_message_json(request, c.text);
        finish = chat_finish_reason(finish, choice["message"].contains("tool_calls"));
        choice["logprobs"] = wants_logprobs(request) ? chat_logprobs(c.tokens, c.logprobs, c.top_logprobs) : ordered_json();
      } else {
        std::string prefix = request.echo && p < request.prompt_texts.size() ? request.prompt_texts[p] : "";
        choice["text"] = prefix + c.text;
        if (!wants_logprobs(request)) {
          choice["logprobs"] = ordered_json();
        } else if (request.echo) {
          choice["logprobs"] = echo_completion_logprobs(prompt_of(p), c, request.prompts[0].logprobs);
        } else {
          choice["logprobs"] = completion_logprobs(c.tokens, c.logprobs, c.top_logprobs, 0);
        }
        if (request.prompt_logprobs >= 0) choice["prompt_logprobs"] = prompt_logprobs_json(prompt_of(p), request.prompt_logprobs);
      }
      choice["finish_reason"] = finish;
      list.push_back(choice);
    }
  }
  out["choices"] = list;
  out["usage"] = usage_json(usage);
  // Chat has one prompt: vLLM puts its logprobs beside the choices.
  if (chat && request.prompt_logprobs >= 0) out["prompt_logprobs"] = prompt_logprobs_json(prompt_of(0), request.prompt_logprobs);
  return out;
}

std::unique_ptr<ChatOutputParser> make_output_parser(const ParsedRequest& request) {
  if (request.endpoint != Endpoint::kChat) return nullptr;
  return std::make_unique<ChatOutputParser>(request.output);
}

std::vector<ordered_json> stream_chunks(const ParsedRequest& request, const std::string& id, int64_t created,
                                        const std::string& model, int choice_index, const GenerateEvent& event,
                                        bool first, ChatOutputParser* parser, const Usage* usage) {
  ordered_json out;
  const bool chat = request.endpoint == Endpoint::kChat;
  out["id"] = id;
  out["object"] = chat ? "chat.completion.chunk" : "text_completion";
  out["created"] = created;
  out["model"] = model;
  std::vector<ordered_json> chunks;
  if (chat && first) {
    // A choice opens with a role-only delta, as OpenAI, vLLM and llama.cpp
    // send it: {"role": "assistant", "content": ""}, then the tokens.
    ordered_json role = out;
    role["choices"] = ordered_json::array(
        {{{"index", choice_index}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
          {"finish_reason", nullptr}}});
    if (request.include_usage) role["usage"] = nullptr;
    if (request.continuous_usage && usage) role["usage"] = usage_json({usage->prompt_tokens, 0, usage->cached_tokens});
    chunks.push_back(std::move(role));
  }
  ordered_json choice;
  choice["index"] = choice_index;
  std::optional<std::string> finish = event.finish_reason;
  if (chat) {
    ChatDelta d;
    if (parser) {
      d = parser->feed(event.text);
      if (event.finish_reason) {
        ChatDelta last = parser->finish();
        d.reasoning += last.reasoning;
        d.content += last.content;
        d.tool_calls.insert(d.tool_calls.end(), last.tool_calls.begin(), last.tool_calls.end());
        finish = chat_finish_reason(*event.finish_reason, parser->tool_called());
      }
    } else {
      d.content = event.text;
    }
    ordered_json delta = ordered_json::object();
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.reasoning.empty()) {
      delta["reasoning_content"] = d.reasoning;
      delta["reasoning"] = d.reasoning;
    }
    if (!d.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const auto& t : d.tool_calls) {
        ordered_json c = {{"index", t.index}};
        if (!t.id.empty()) {
          c["id"] = t.id;
          c["type"] = "function";
          c["function"] = {{"name", t.name}, {"arguments", t.arguments}};
        } else {
          c["function"] = {{"arguments", t.arguments}};
        }
        calls.push_back(c);
      }
      delta["tool_calls"] = calls;
    }
    if (delta.empty() && !finish && !wants_logprobs(request)) return chunks;  // all held back
    choice["delta"] = delta;
    choice["logprobs"] = wants_logprobs(request) ? chat_logprobs(event.tokens, event.logprobs, event.top_logprobs) : ordered_json();
  } else {
    // echo: a choice's first chunk opens with its prompt's text, and with
    // logprobs the prompt's tokens come first in its logprobs (as vLLM
    // streams it); they ride on the event that brings the prompt's logprobs.
    const bool echo_now = request.echo && (wants_logprobs(request) ? !event.prompt_logprobs.empty() : first);
    const size_t n_per_prompt = request.prompts.empty() ? 1 : static_cast<size_t>(std::max(1, request.prompts[0].n));
    const size_t p = static_cast<size_t>(choice_index) / n_per_prompt;
    choice["text"] = (echo_now && p < request.prompt_texts.size() ? request.prompt_texts[p] : std::string()) + event.text;
    if (!wants_logprobs(request)) {
      choice["logprobs"] = ordered_json();
    } else if (echo_now) {
      ChoiceResult generated;
      generated.tokens = event.tokens;
      generated.logprobs = event.logprobs;
      generated.top_logprobs = event.top_logprobs;
      choice["logprobs"] = echo_completion_logprobs(event.prompt_logprobs, generated, request.prompts[0].logprobs);
    } else {
      choice["logprobs"] = completion_logprobs(event.tokens, event.logprobs, event.top_logprobs, 0);
    }
  }
  choice["finish_reason"] = finish ? ordered_json(*finish) : ordered_json();
  out["choices"] = ordered_json::array({choice});
  if (request.include_usage) out["usage"] = nullptr;
  if (request.continuous_usage && usage) out["usage"] = usage_json(*usage);
  chunks.push_back(std::move(out));
  return chunks;
}

ordered_json usage_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                         const std::string& model, const Usage& usage) {
  ordered_json out;
  out["id"] = id;
  out["object"] = request.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
  out["created"] = created;
  out["model"] = model;
  out["choices"] = ordered_json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace shardlm::server
