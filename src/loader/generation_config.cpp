#include "loader/generation_config.h"

#include <cstdint>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/bounded_json_file.h"
#include "core/error.h"

namespace shardlm {

std::vector<int64_t> load_eos_token_ids(const std::filesystem::path& dir, const ModelSpec& spec) {
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return spec.eos_token_ids;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = parse_json_file(in, path.string());
  } catch (const nlohmann::json::exception& e) {
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
  // The sampler indexes logits[row * vocab + eos]: an id outside the
  // vocabulary would be a write outside the buffer.
  for (int64_t id : ids)
    if (id < 0 || id >= spec.vocab_size)
      fail(ErrorCode::kInvalidArgument, path.string(), ": eos_token_id ", id, " is outside the vocabulary [0, ",
           spec.vocab_size, ") of config.json's vocab_size");
  return ids;
}

GenerationDefaults load_generation_defaults(const std::filesystem::path& dir) {
  GenerationDefaults d;
  const auto path = dir / "generation_config.json";
  if (!std::filesystem::exists(path)) return d;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = parse_json_file(in, path.string());
  } catch (const nlohmann::json::exception& e) {
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
  // They become every request's defaults, past the checks a request's own
  // values get: refuse what a request could not send. (1e400 never gets
  // here: the parser refuses a number a double cannot hold.)
  auto out_of_range = [&](const char* key, auto value, const char* range) {
    fail(ErrorCode::kInvalidArgument, path.string(), ": ", key, " is ", value, ", outside ", range);
  };
  if (d.temperature && !(*d.temperature >= 0)) out_of_range("temperature", *d.temperature, "[0, inf)");
  if (d.top_p && !(*d.top_p > 0 && *d.top_p <= 1)) out_of_range("top_p", *d.top_p, "(0, 1]");
  if (d.top_k && *d.top_k < -1) out_of_range("top_k", *d.top_k, "[-1, inf) (-1 and 0 mean off)");
  if (d.top_k && *d.top_k > INT32_MAX) out_of_range("top_k", *d.top_k, "[-1, 2^31)");
  if (d.min_p && !(*d.min_p >= 0 && *d.min_p <= 1)) out_of_range("min_p", *d.min_p, "[0, 1]");
  if (d.repetition_penalty && !(*d.repetition_penalty > 0)) out_of_range("repetition_penalty", *d.repetition_penalty, "(0, inf)");
  if (d.max_new_tokens && *d.max_new_tokens < 1) out_of_range("max_new_tokens", *d.max_new_tokens, "[1, inf)");
  // do_sample is not read: vLLM does not read it either.
  return d;
}

}  // namespace shardlm
