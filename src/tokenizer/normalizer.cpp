#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

std::string utf8proc_apply(std::string_view text, int options, const char* name) {
  if (text.empty()) return {};
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                    static_cast<utf8proc_ssize_t>(text.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0)
    fail(ErrorCode::kInvalidArgument, name, " normalisation failed: ", utf8proc_errmsg(n),
         " (the text must be valid UTF-8)");
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t n = utf8::sequence_length(text, pos);
    if (n == 0) fail(ErrorCode::kInvalidArgument, "Lowercase normaliser: invalid UTF-8 at byte ", pos);
    utf8::append(out, static_cast<uint32_t>(utf8proc_tolower(utf8::decode_at(text, pos, n))));
    pos += n;
  }
  return out;
}

bool is_space_at(std::string_view text, size_t pos, size_t n) {
  uint32_t cp = utf8::decode_at(text, pos, n);
  auto cat = utf8proc_category(cp);
  return cp == '\t' || cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x85 ||
         cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

}  // namespace

std::string normalize_nfc(std::string_view text) {
  return utf8proc_apply(text, UTF8PROC_STABLE | UTF8PROC_COMPOSE, "NFC");
}

std::string normalize_nfkc(std::string_view text) {
  return utf8proc_apply(text, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, "NFKC");
}

Normalizer::Normalizer(const nlohmann::json& config, const std::string& where) {
  if (!config.is_null()) add(config, where);
}

void Normalizer::add(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    fail(ErrorCode::kCorruptFile, where, ": expected an object with a string \"type\", found ", config.dump());
  std::string type = config["type"];
  if (type == "Sequence") {
    const auto& list = config.value("normalizers", nlohmann::json());
    if (!list.is_array()) fail(ErrorCode::kCorruptFile, where, ".normalizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], str_cat(where, ".normalizers[", i, "]"));
    return;
  }
  Step step{};
  if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    step.text = config.value("prepend", "");
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.strip_left = config.value("strip_left", false);
    step.strip_right = config.value("strip_right", false);
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    step.text = config.value("content", "");
    const auto& pattern = config.value("pattern", nlohmann::json());
    if (pattern.contains("String") && pattern["String"].is_string()) {
      step.literal = pattern["String"];
      if (step.literal.empty()) fail(ErrorCode::kCorruptFile, where, ".pattern.String: must not be empty");
    } else if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else {
      fail(ErrorCode::kCorruptFile, where, ".pattern: expected {\"String\": ...} or {\"Regex\": ...}");
    }
  } else {
    fail(ErrorCode::kUnsupported, where, ": normalizer type \"", type,
         "\" is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip, Sequence)");
  }
  steps_.push_back(std::move(step));
}

std::string Normalizer::apply(std::string_view input) const {
  std::string text(input);
  for (const auto& step : steps_) {
    switch (step.kind) {
      case Kind::kNfc: text = normalize_nfc(text); break;
      case Kind::kNfd: text = utf8proc_apply(text, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, "NFD"); break;
      case Kind::kNfkc: text = normalize_nfkc(text); break;
      case Kind::kNfkd:
        text = utf8proc_apply(text, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, "NFKD");
        break;
      case Kind::kLowercase: text = lowercase(text); break;
      case Kind::kPrepend:
        if (!text.empty()) text = step.text + text;
        break;
      case Kind::kStrip: {
        size_t begin = 0, end = text.size();
        while (step.strip_left && begin < end) {
          size_t n = utf8::sequence_length(text, begin);
          if (n == 0 || !is_space_at(text, begin, n)) break;
          begin += n;
        }
        while (step.strip_right && end > begin) {
          size_t start = end - 1;
          while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
          size_t n = utf8::sequence_length(text, start);
          if (n == 0 || !is_space_at(text, start, n)) break;
          end = start;
        }
        text = text.substr(begin, end - begin);
        break;
      }
      case Kind::kReplace: {
        std::string out;
        size_t last = 0;
        if (step.regex) {
          for (auto [b, e] : step.regex->find_all(text)) {
            out.append(text, last, b - last);
            out.append(step.text);
            last = e;
          }
        } else {
          for (size_t at = text.find(step.literal); at != std::string::npos;
               at = text.find(step.literal, last)) {
            out.append(text, last, at - last);
            out.append(step.text);
            last = at + step.literal.size();
          }
        }
        out.append(text, last);
        text = std::move(out);
        break;
      }
    }
  }
  return text;
}

}  // namespace shardlm
