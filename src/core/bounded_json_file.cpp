#include "core/bounded_json_file.h"

#include "core/error.h"

namespace shardlm {
namespace {

nlohmann::json::parser_callback_t depth_guard(const std::string& file) {
  return [&file](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (depth >= kMaxFileJsonDepth && (event == nlohmann::json::parse_event_t::object_start ||
                                       event == nlohmann::json::parse_event_t::array_start))
      fail(ErrorCode::kCorruptFile, file, ": JSON nested deeper than ", kMaxFileJsonDepth,
           " levels; no real checkpoint file nests so deep: the file is damaged or hostile (download it again)");
    return true;
  };
}

}  // namespace

nlohmann::json parse_json_file(std::istream& in, const std::string& file) {
  return nlohmann::json::parse(in, depth_guard(file));
}

nlohmann::json parse_json_file(std::string_view text, const std::string& file) {
  return nlohmann::json::parse(text.begin(), text.end(), depth_guard(file));
}

}  // namespace shardlm
