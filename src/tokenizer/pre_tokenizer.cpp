#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace shardlm {

namespace {

// GPT-2's pattern, used by ByteLevel when use_regex is true.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin, end;
  bool is_match;
};

}  // namespace

PreTokenizer::PreTokenizer(const nlohmann::json& config, const std::string& where) {
  if (!config.is_null()) add(config, where);
}

void PreTokenizer::add(const nlohmann::json& config, const std::string& where) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    fail(ErrorCode::kCorruptFile, where, ": expected an object with a string \"type\", found ", config.dump());
  std::string type = config["type"];
  if (type == "Sequence") {
    const auto& list = config.value("pretokenizers", nlohmann::json());
    if (!list.is_array()) fail(ErrorCode::kCorruptFile, where, ".pretokenizers: expected an array");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], str_cat(where, ".pretokenizers[", i, "]"));
    return;
  }
  Step step{};
  if (type == "Split") {
    step.kind = Kind::kSplit;
    const auto& pattern = config.value("pattern", nlohmann::json());
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      step.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), where + ".pattern.Regex");
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      step.literal = pattern["String"];
      if (step.literal.empty()) fail(ErrorCode::kCorruptFile, where, ".pattern.String: must not be empty");
    } else {
      fail(ErrorCode::kCorruptFile, where, ".pattern: expected {\"Regex\": ...} or {\"String\": ...}, found ",
           pattern.dump());
    }
    std::string behavior = config.value("behavior", "Isolated");
    if (behavior == "Removed") step.behavior = Behavior::kRemoved;
    else if (behavior == "Isolated") step.behavior = Behavior::kIsolated;
    else if (behavior == "MergedWithPrevious") step.behavior = Behavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = Behavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = Behavior::kContiguous;
    else
      fail(ErrorCode::kCorruptFile, where, ".behavior: \"", behavior,
           "\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    step.invert = config.value("invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = config.value("add_prefix_space", true);
    if (config.value("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern, where + " (GPT-2 regex)");
    byte_level_ = true;
  } else if (type == "Digits") {
    step.kind = Kind::kDigits;
    step.individual_digits = config.value("individual_digits", false);
    step.regex = std::make_shared<Regex>(step.individual_digits ? R"(\p{Nd})" : R"(\p{Nd}+)", where);
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = config.value("replacement", "\u2581");
    if (step.replacement.empty()) fail(ErrorCode::kCorruptFile, where, ".replacement: must not be empty");
    // Older files say add_prefix_space (true = always) instead of prepend_scheme.
    const std::string scheme =
        config.value("prepend_scheme", config.value("add_prefix_space", true) ? "always" : "never");
    if (scheme == "always") step.prepend = Prepend::kAlways;
    else if (scheme == "first") step.prepend = Prepend::kFirst;
    else if (scheme == "never") step.prepend = Prepend::kNever;
    else fail(ErrorCode::kCorruptFile, where, ".prepend_scheme: \"", scheme, "\" is not one of always, first, never");
    step.split_on_replacement = config.value("split", true);
  } else {
    fail(ErrorCode::kUnsupported, where, ": pre_tokenizer type \"", type,
         "\" is not supported (supported: Split, ByteLevel, Digits, Metaspace, Sequence)");
  }
  steps_.push_back(std::move(step));
}

void PreTokenizer::apply(std::string_view text, std::vector<std::string>& out, bool first_section) const {
  if (steps_.empty()) {
    if (!text.empty()) out.emplace_back(text);
    return;
  }
  std::vector<std::string> current{std::string(text)};
  std::vector<std::string> next;
  for (const auto& step : steps_) {
    next.clear();
    for (size_t i = 0; i < current.size(); ++i) run_step(step, current[i], first_section && i == 0, next);
    current.swap(next);
  }
  for (auto& piece : current)
    if (!piece.empty()) out.push_back(std::move(piece));
}

void PreTokenizer::run_step(const Step& step, std::string_view piece, bool first_piece,
                            std::vector<std::string>& out) const {
  switch (step.kind) {
    case Kind::kMetaspace: {
      // HF: spaces become the replacement, then "▁" is prepended (always, or
      // only where the text starts the input), then the text is split before
      // every "▁" (MergedWithNext), so "▁Hello▁world" is "▁Hello", "▁world".
      if (piece.empty()) return;
      std::string text;
      text.reserve(piece.size() + step.replacement.size());
      const bool starts = piece.substr(0, step.replacement.size()) == step.replacement || piece.front() == ' ';
      if (!starts &&
          (step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && first_piece)))
        text = step.replacement;
      for (char c : piece) {
        if (c == ' ') text += step.replacement;
        else text += c;
      }
      if (!step.split_on_replacement) {
        out.push_back(std::move(text));
        return;
      }
      size_t begin = 0;
      for (size_t at = text.find(step.replacement, 1); at != std::string::npos;
           at = text.find(step.replacement, at + step.replacement.size())) {
        if (at > begin) out.push_back(text.substr(begin, at - begin));
        begin = at;
      }
      if (begin < text.size()) out.push_back(text.substr(begin));
      return;
    }
    case Kind::kSplit:
    case Kind::kDigits:
      split(step, piece, out);
      return;
    case Kind::kByteLevel: {
      std::string prefixed;
      if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
        prefixed = " ";
        prefixed.append(piece);
        piece = prefixed;
      }
      auto emit = [&](std::string_view part) {
        std::string mapped;
        mapped.reserve(part.size() * 2);
        byte_level::encode(part, mapped);
        out.push_back(std::move(mapped));
      };
      if (!step.regex) {
        emit(piece);
        return;
      }
      for (auto [b, e] : step.regex->find_all(piece)) emit(piece.substr(b, e - b));
      // The GPT-2 pattern matches every character, so nothing is left between matches.
      return;
    }
  }
}

void PreTokenizer::split(const Step& step, std::string_view text, std::vector<std::string>& out) const {
  if (text.empty()) return;
  // Matches and the gaps between them, covering text (HF's find_matches).
  std::vector<Span> spans;
  size_t prev = 0;
  auto add_match = [&](size_t b, size_t e) {
    if (prev != b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  };
  if (step.regex) {
    for (auto [b, e] : step.regex->find_all(text)) add_match(b, e);
  } else {
    for (size_t at = text.find(step.literal); at != std::string_view::npos;
         at = text.find(step.literal, prev))
      add_match(at, at + step.literal.size());
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  if (step.invert)
    for (auto& s : spans) s.is_match = !s.is_match;

  std::vector<Span> pieces;
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::kIsolated:
      pieces = spans;
      break;
    case Behavior::kRemoved:
      for (const auto& s : spans)
        if (!s.is_match) pieces.push_back(s);
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !pieces.empty())
          pieces.back().end = s.end;
        else
          pieces.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty())
          pieces.back().begin = it->begin;
        else
          pieces.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case Behavior::kContiguous:
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !pieces.empty())
          pieces.back().end = s.end;
        else
          pieces.push_back(s);
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& p : pieces)
    if (p.end > p.begin) out.emplace_back(text.substr(p.begin, p.end - p.begin));
}

}  // namespace shardlm
