#include "loader/generation_config.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

std::vector<int64_t> load_eos_token_ids(const std::filesystem::path& dir, const ModelSpec& spec) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return spec.eos_token_ids;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    fail(ErrorCode::kCorruptFile, path.string(), ": not valid JSON (", e.what(), ")");
  }
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return spec.eos_token_ids;
  std::vector<int64_t> ids;
  if (it->is_number_integer()) {
    ids.push_back(it->get<int64_t>());
  } else if (it->is_array()) {
    for (const auto& e : *it) {
      if (!e.is_number_integer())
        fail(ErrorCode::kInvalidArgument, path.string(), ": eos_token_id entries must be integers, found ", e.dump());
      ids.push_back(e.get<int64_t>());
    }
  } else {
    fail(ErrorCode::kInvalidArgument, path.string(), ": eos_token_id must be an integer or a list, found ", it->dump());
  }
  return ids;
}

GenerationDefaults load_generation_defaults(const std::filesystem::path& dir) {
  GenerationDefaults d;
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    fail(ErrorCode::kCorruptFile, path.string(), ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail(ErrorCode::kCorruptFile, path.string(), ": must be a JSON object");
  auto number = [&](const char* key, std::optional<double>* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number()) fail(ErrorCode::kInvalidArgument, path.string(), ": ", key, " must be a number, found ", it->dump());
    *out = it->get<double>();
  };
  auto integer = [&](const char* key, std::optional<int64_t>* out) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    if (!it->is_number_integer())
      fail(ErrorCode::kInvalidArgument, path.string(), ": ", key, " must be an integer, found ", it->dump());
    *out = it->get<int64_t>();
  };
  number("temperature", &d.temperature);
  number("top_p", &d.top_p);
  integer("top_k", &d.top_k);
  number("min_p", &d.min_p);
  number("repetition_penalty", &d.repetition_penalty);
  integer("max_new_tokens", &d.max_new_tokens);
  // do_sample is not read: vLLM does not read it either.
  return d;
}

}  // namespace shardlm
