// Request JSON parsed with bounded nesting. nlohmann's dump(), operator==
// and every walk of ours over a value recurse once per level, so a body of
// 100,000 '[' exhausts the stack of whichever thread touches it first. Every
// body or JSON-in-a-string a client sends goes through parse_bounded_json,
// which counts the depth as nlohmann's (iterative) parser reads and stops
// at the limit, before any recursive code sees the value.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shardlm::server {

// Real request bodies nest a dozen levels; json_schemas 20-30.
constexpr int kMaxJsonDepth = 64;
// Bodies are parsed into nlohmann::ordered_json, whose objects find a key by a
// linear scan, so building one of n members costs n^2/2 key comparisons: a
// 1 MB body of 80,000 distinct keys took 12-19 s of CPU. The parser refuses,
// as it reads (before the quadratic object exists), an object of more than
// kMaxJsonObjectMembers members (real tool schemas have tens; OpenAI caps
// logit_bias at 300 and enums at 1,000), more than kMaxJsonKeyComparisons
// comparisons over the whole text (many large objects), and more than
// kMaxJsonValues values in all.
constexpr size_t kMaxJsonObjectMembers = 2048;
constexpr size_t kMaxJsonKeyComparisons = size_t(8) << 20;  // ~4 objects at the member limit; ~50 ms
constexpr size_t kMaxJsonValues = 1'000'000;

// The deepest nesting of arrays/objects in `text`, stopping the scan as soon
// as it passes `limit` (so the answer is at most limit + 1). Brackets inside
// strings (escapes included) do not count. Malformed JSON is measured as far
// as it goes; the parser refuses it afterwards.
int json_nesting_depth(std::string_view text, int limit);

// Parses `text` as JSON, or throws ApiException(400, param): nesting deeper
// than `max_depth` ("<what> is nested deeper than 64 levels"), an object or
// a text past the size limits above (each message names its limit),
// malformed JSON, or a number out of range (1e400). `what` names the text in
// the message: "the request body", "'guided_json'".
nlohmann::ordered_json parse_bounded_json(std::string_view text, const std::string& what, const std::string& param = "",
                                          int max_depth = kMaxJsonDepth);

// A user value as it may be quoted in an error message: compact, invalid
// UTF-8 replaced, cut to `max_bytes` (with "..."). Never throws.
std::string brief_json(const nlohmann::ordered_json& value, size_t max_bytes = 80);

// A user string cut to `max_bytes` for an error message.
std::string brief_text(std::string_view text, size_t max_bytes = 80);

// object[key] when `object` is an object holding a string there, else "".
// For checks such as part.type == "text": nlohmann's value(key, "") throws
// type_error (a 500) when the client sent a number.
std::string string_field(const nlohmann::ordered_json& object, const char* key);

}  // namespace shardlm::server
