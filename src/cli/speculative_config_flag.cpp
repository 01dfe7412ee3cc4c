#include "cli/speculative_config_flag.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm::cli {

const char* const kSpeculativeConfigHelp =
    "Speculative decoding, vLLM's JSON: {\"method\":\"ngram\",\"num_speculative_tokens\":4,"
    "\"prompt_lookup_max\":4,\"prompt_lookup_min\":2} (prompt lookup), or {\"model\":DIR,\"num_speculative_tokens\":4} "
    "(a draft model with the target's tokenizer, beside the driver); verified on the batch-invariant "
    "kernels, which it turns on: greedy tokens are those without it, sampled ones keep the target distribution)";

// --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}'
// (vLLM's keys). Every key is checked; one shardlm does not implement is refused, naming it.
SpeculativeOptions parse_speculative_config(const std::string& text) {
  SpeculativeOptions so;
  if (text.empty()) return so;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail(ErrorCode::kInvalidArgument, "--speculative-config: expected a JSON object, got '", text, "'");
  auto int_key = [&](const char* key, int32_t* out) {
    if (!j.contains(key)) return false;
    if (!j[key].is_number_integer())
      fail(ErrorCode::kInvalidArgument, "--speculative-config: \"", key, "\" must be an integer");
    *out = j[key].get<int32_t>();
    return true;
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key != "method" && key != "model" && key != "num_speculative_tokens" && key != "prompt_lookup_max" &&
        key != "prompt_lookup_min" && key != "disable_by_batch_size")
      fail(ErrorCode::kInvalidArgument, "--speculative-config: unknown key \"", key,
           "\" (shardlm implements method, model, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, "
           "disable_by_batch_size)");
  }
  // vLLM infers "draft_model" from "model"; "ngram" is prompt lookup.
  std::string method = j.contains("model") ? "draft_model" : "";
  if (j.contains("method")) {
    if (!j["method"].is_string()) fail(ErrorCode::kInvalidArgument, "--speculative-config: \"method\" must be a string");
    method = j["method"].get<std::string>();
  }
  if (method != "ngram" && method != "draft_model")
    fail(ErrorCode::kUnsupported, "--speculative-config: \"method\" must be \"ngram\" or \"draft_model\" (with "
         "\"model\"), got \"", method, "\"");
  if (!int_key("num_speculative_tokens", &so.num_speculative_tokens) || so.num_speculative_tokens < 1)
    fail(ErrorCode::kInvalidArgument, "--speculative-config: \"num_speculative_tokens\" must be given, at least 1");
  if (method == "draft_model") {
    if (!j.contains("model") || !j["model"].is_string() || j["model"].get<std::string>().empty())
      fail(ErrorCode::kInvalidArgument, "--speculative-config: method draft_model needs \"model\": the draft "
           "checkpoint's directory");
    for (const char* key : {"prompt_lookup_max", "prompt_lookup_min"})
      if (j.contains(key))
        fail(ErrorCode::kInvalidArgument, "--speculative-config: \"", key, "\" is a key of method ngram, not of a "
             "draft model");
    so.draft_model = j["model"].get<std::string>();
    const std::filesystem::path dir(so.draft_model);
    if (!std::filesystem::is_regular_file(dir / "config.json"))
      fail(ErrorCode::kNotFound, "--speculative-config \"model\": ", (dir / "config.json").string(),
           " not found; \"model\" must be a local checkpoint directory (config.json and *.safetensors)");
  } else {
    if (j.contains("model"))
      fail(ErrorCode::kInvalidArgument, "--speculative-config: \"model\" with method ngram; drop one of them");
    so.prompt_lookup_min = 1;
    if (!int_key("prompt_lookup_max", &so.prompt_lookup_max))
      fail(ErrorCode::kInvalidArgument, "--speculative-config: \"prompt_lookup_max\" must be given for method ngram");
    int_key("prompt_lookup_min", &so.prompt_lookup_min);
  }
  if (int_key("disable_by_batch_size", &so.disable_by_batch_size) && so.disable_by_batch_size < 1)
    fail(ErrorCode::kInvalidArgument, "--speculative-config: \"disable_by_batch_size\" must be at least 1, got ",
         so.disable_by_batch_size);
  so.validate();
  return so;
}

}  // namespace shardlm::cli
