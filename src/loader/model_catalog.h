// Built-in catalog of real model shapes (official config.json values), used by
// `plan NAME` and `make-model --like NAME`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/model_spec.h"

namespace shardlm {

struct CatalogModel {
  const char* name;                // "qwen2.5-7b"
  const char* hf_name;             // "Qwen2.5-7B-Instruct"
  int64_t hf_total_size_bytes;     // official index total, -1 when unknown
  const char* config_json;         // the architecture fields of config.json
};

const std::vector<CatalogModel>& model_catalog();

// Finds a catalog entry by short or HF name, case-insensitively; nullptr if none.
const CatalogModel* find_catalog_model(const std::string& name);
// Throws Error(kNotFound) listing every catalog name when `name` is unknown.
ModelSpec catalog_model_spec(const std::string& name);
// "qwen2.5-0.5b, qwen2.5-1.5b, ..."
std::string catalog_names();

}  // namespace shardlm
