// generation_config.json: the token ids that end a generation. Chat models
// list more there (Llama-3.1: <|eot_id|>, <|eom_id|>) than config.json does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "loader/model_spec.h"

namespace shardlm {

// generation_config.json's eos_token_id when present, else config.json's
// (spec.eos_token_ids). Throws Error naming the file when it is malformed.
std::vector<int64_t> load_eos_token_ids(const std::filesystem::path& model_dir, const ModelSpec& spec);

// The sampling values of generation_config.json that vLLM's
// `--generation-config auto` uses as request defaults (unset when absent).
struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_new_tokens;
};
// No file: all unset. Throws Error naming the file and field when a value has the wrong type.
GenerationDefaults load_generation_defaults(const std::filesystem::path& model_dir);

}  // namespace shardlm
