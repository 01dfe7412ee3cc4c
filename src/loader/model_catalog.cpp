#include "loader/model_catalog.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

const CatalogModel* find_catalog_model(const std::string& name) {
  std::string key = lower(name);
  for (const auto& m : model_catalog()) {
    if (key == m.name || key == lower(m.hf_name) || key == lower(std::string("Qwen/") + m.hf_name) ||
        key == lower(std::string("meta-llama/") + m.hf_name) || key == lower(std::string("mistralai/") + m.hf_name))
      return &m;
  }
  return nullptr;
}

std::string catalog_names() {
  std::string out;
  for (const auto& m : model_catalog()) out += (out.empty() ? "" : ", ") + std::string(m.name);
  return out;
}

ModelSpec catalog_model_spec(const std::string& name) {
  const CatalogModel* m = find_catalog_model(name);
  if (!m) fail(ErrorCode::kNotFound, "unknown model \"", name, "\"; the built-in catalog has: ", catalog_names());
  return parse_model_config(nlohmann::json::parse(m->config_json), std::string("catalog:") + m->name);
}

}  // namespace shardlm
