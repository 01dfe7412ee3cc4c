#include "loader/config_fields.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

using nlohmann::json;

int64_t required_int(const json& config, const char* field, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null())
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" is missing; config.json of this architecture must set it");
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be a positive integer, found ", it->dump());
  return it->get<int64_t>();
}

int64_t optional_int(const json& config, const char* field, int64_t fallback, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0)
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be a non-negative integer, found ", it->dump());
  return it->get<int64_t>();
}

double optional_number(const json& config, const char* field, double fallback, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number())
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be a number, found ", it->dump());
  return it->get<double>();
}

bool optional_bool(const json& config, const char* field, bool fallback, const std::string& source) {
  auto it = config.find(field);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    fail(ErrorCode::kInvalidArgument, source, ": field \"", field, "\" must be true or false, found ", it->dump());
  return it->get<bool>();
}

}  // namespace shardlm
