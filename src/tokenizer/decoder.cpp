#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace shardlm {

namespace {

const char* const kSupported = "ByteLevel, Metaspace, null, or a Sequence of Replace, ByteFallback, Fuse, Strip";

// "<0x0A>" -> 0x0A; -1 for anything else.
int byte_token(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') value += c - '0';
    else if (c >= 'A' && c <= 'F') value += c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') value += c - 'a' + 10;
    else return -1;
  }
  return value;
}

}  // namespace

Decoder::Decoder(const nlohmann::json& config, const std::string& where) {
  if (!config.is_null()) add(config, where, false);
}

void Decoder::add(const nlohmann::json& config, const std::string& where, bool in_sequence) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    fail(ErrorCode::kCorruptFile, where, ": expected an object with a string \"type\", found ", config.dump());
  const std::string type = config["type"];
  if (type == "Sequence" && !in_sequence) {
    const auto& list = config.value("decoders", nlohmann::json());
    if (!list.is_array()) fail(ErrorCode::kCorruptFile, where, ".decoders: expected an array");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], str_cat(where, ".decoders[", i, "]"), true);
    return;
  }
  if (type == "ByteLevel" && !in_sequence) {
    byte_level_ = true;
  } else if (type == "Metaspace" && !in_sequence) {
    std::string replacement = config.value("replacement", "\u2581");
    if (replacement.empty()) fail(ErrorCode::kCorruptFile, where, ".replacement: must not be empty");
    replacements_.push_back({replacement, " "});
    // HF drops the first token's leading space unless prepend_scheme is
    // "never" (older files: add_prefix_space).
    const std::string scheme = config.value("prepend_scheme", config.value("add_prefix_space", true) ? "always" : "never");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      fail(ErrorCode::kCorruptFile, where, ".prepend_scheme: \"", scheme, "\" is not one of always, first, never");
    strip_leading_ = scheme == "never" ? 0 : 1;
  } else if (type == "Replace") {
    const auto& pattern = config.value("pattern", nlohmann::json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string())
      fail(ErrorCode::kUnsupported, where, ".pattern: only {\"String\": ...} patterns are supported in a Replace decoder, found ",
           pattern.dump());
    std::string from = pattern["String"];
    if (from.empty()) fail(ErrorCode::kCorruptFile, where, ".pattern.String: must not be empty");
    if (fused_) fail(ErrorCode::kUnsupported, where, ": a Replace decoder after Fuse is not supported");
    replacements_.push_back({from, config.value("content", "")});
  } else if (type == "ByteFallback") {
    if (!replacements_.empty() && fused_) fail(ErrorCode::kUnsupported, where, ": ByteFallback after Fuse is not supported");
    byte_fallback_ = true;
  } else if (type == "Fuse") {
    fused_ = true;
  } else if (type == "Strip") {
    const std::string content = config.value("content", " ");
    const int64_t start = config.value("start", int64_t{0});
    const int64_t stop = config.value("stop", int64_t{0});
    if (content != " ")
      fail(ErrorCode::kUnsupported, where, ".content: only \" \" can be stripped, found \"", content, "\"");
    if (stop != 0)
      fail(ErrorCode::kUnsupported, where, ".stop: stripping the end of the text (stop=", stop,
           ") is not supported; streaming could not know where the end is");
    if (start < 0) fail(ErrorCode::kCorruptFile, where, ".start: must be >= 0, found ", start);
    if (!fused_ && start > 0)
      fail(ErrorCode::kUnsupported, where, ": Strip before Fuse (stripping every token) is not supported");
    strip_leading_ += static_cast<size_t>(start);
  } else {
    fail(ErrorCode::kUnsupported, where, ": decoder type \"", type, "\"", in_sequence ? " inside a Sequence" : "",
         " is not supported (supported: ", kSupported, ")");
  }
}

std::string Decoder::token_bytes(std::string_view token) const {
  std::string out;
  if (byte_level_) {
    // A token that is not all byte-level stand-ins decodes to its own text (as HF does).
    if (!byte_level::decode(token, out)) out.assign(token);
    return out;
  }
  out.assign(token);
  for (const auto& r : replacements_) {
    std::string next;
    size_t last = 0;
    for (size_t at = out.find(r.from); at != std::string::npos; at = out.find(r.from, last)) {
      next.append(out, last, at - last);
      next.append(r.to);
      last = at + r.from.size();
    }
    next.append(out, last);
    out = std::move(next);
  }
  if (byte_fallback_) {
    if (int b = byte_token(out); b >= 0) return std::string(1, static_cast<char>(b));
  }
  return out;
}

}  // namespace shardlm
