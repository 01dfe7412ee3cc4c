// JSON files of a checkpoint (config.json, generation_config.json, the
// safetensors index, tokenizer.json, tokenizer_config.json, ...) parsed
// with their nesting bounded. nlohmann's parser is iterative, but dump(),
// operator== and every walk over a value recurse once per level: a
// config.json of 100,000 '[' would crash whichever code touched it first,
// long after loading "succeeded". Real files nest under a dozen levels.
#pragma once

#include <istream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shardlm {

constexpr int kMaxFileJsonDepth = 128;

// As nlohmann::json::parse (malformed text still throws json::parse_error),
// but nesting deeper than kMaxFileJsonDepth throws Error(kCorruptFile)
// naming `file`, as soon as the parser reaches that depth.
nlohmann::json parse_json_file(std::istream& in, const std::string& file);
nlohmann::json parse_json_file(std::string_view text, const std::string& file);

}  // namespace shardlm
