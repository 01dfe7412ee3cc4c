// Reading config.json fields with errors that name the file and the field.
// Shared by model_spec.cpp (the fields every family has) and the families'
// own parsers (loader/families/).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

// A required positive integer. Throws kInvalidArgument naming the field when absent or not positive.
int64_t required_int(const nlohmann::json& config, const char* field, const std::string& source);
// A non-negative integer, `fallback` when absent or null.
int64_t optional_int(const nlohmann::json& config, const char* field, int64_t fallback, const std::string& source);
double optional_number(const nlohmann::json& config, const char* field, double fallback, const std::string& source);
bool optional_bool(const nlohmann::json& config, const char* field, bool fallback, const std::string& source);

}  // namespace shardlm
