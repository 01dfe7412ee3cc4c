// generation_config.json: the token ids that end a generation. Chat models
// list more there (Llama-3.1: <|eot_id|>, <|eom_id|>) than config.json does.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "loader/model_spec.h"

namespace shardlm {

// generation_config.json's eos_token_id when present, else config.json's
// (spec.eos_token_ids). Throws Error naming the file when it is malformed.
std::vector<int64_t> load_eos_token_ids(const std::filesystem::path& model_dir, const ModelSpec& spec);

}  // namespace shardlm
