#include "tokenizer/added_vocab.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Word characters for single_word: ASCII alphanumerics, '_' and any non-ASCII
// byte (letters of other scripts), which is how the regex \w behaves on
// the texts this matters for.
bool is_word_byte(char c) {
  auto b = static_cast<uint8_t>(c);
  return b >= 0x80 || std::isalnum(b) || c == '_';
}

}  // namespace

AddedVocab::AddedVocab(const nlohmann::json& list, const std::string& where) {
  if (list.is_null()) return;
  if (!list.is_array()) fail(ErrorCode::kCorruptFile, where, ": expected an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& t = list[i];
    std::string at = str_cat(where, "[", i, "]");
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string())
      fail(ErrorCode::kCorruptFile, at, ": expected {\"id\": int, \"content\": string, ...}, found ", t.dump());
    AddedToken token;
    token.id = t["id"].get<TokenId>();
    token.content = t["content"];
    if (token.id < 0) fail(ErrorCode::kCorruptFile, at, ".id: must be non-negative, found ", token.id);
    if (token.content.empty()) fail(ErrorCode::kCorruptFile, at, ".content: must not be empty");
    token.special = t.value("special", false);
    token.lstrip = t.value("lstrip", false);
    token.rstrip = t.value("rstrip", false);
    token.single_word = t.value("single_word", false);
    token.normalized = t.value("normalized", !token.special);
    tokens_.push_back(std::move(token));
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i)
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  for (auto& list_for_byte : by_first_byte_)
    std::stable_sort(list_for_byte.begin(), list_for_byte.end(), [&](uint32_t a, uint32_t b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
}

bool AddedVocab::matches(const AddedToken& token, std::string_view text, size_t pos, size_t floor,
                         size_t* begin, size_t* end) const {
  if (text.compare(pos, token.content.size(), token.content) != 0) return false;
  size_t b = pos, e = pos + token.content.size();
  if (token.single_word) {
    if (b > 0 && is_word_byte(text[b - 1]) && is_word_byte(token.content.front())) return false;
    if (e < text.size() && is_word_byte(text[e]) && is_word_byte(token.content.back())) return false;
  }
  if (token.lstrip)
    while (b > floor && is_ascii_space(text[b - 1])) --b;
  if (token.rstrip)
    while (e < text.size() && is_ascii_space(text[e])) ++e;
  *begin = b;
  *end = e;
  return true;
}

std::vector<TextSection> AddedVocab::split(std::string_view text) const {
  std::vector<TextSection> sections;
  if (tokens_.empty()) {
    if (!text.empty()) sections.push_back({text, nullptr});
    return sections;
  }
  size_t plain_start = 0;  // start of the pending plain-text section
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& candidates = by_first_byte_[static_cast<uint8_t>(text[pos])];
    bool found = false;
    for (uint32_t index : candidates) {
      size_t b = 0, e = 0;
      if (!matches(tokens_[index], text, pos, plain_start, &b, &e)) continue;
      if (b > plain_start) sections.push_back({text.substr(plain_start, b - plain_start), nullptr});
      sections.push_back({text.substr(b, e - b), &tokens_[index]});
      pos = plain_start = e;
      found = true;
      break;
    }
    if (!found) ++pos;
  }
  if (plain_start < text.size()) sections.push_back({text.substr(plain_start), nullptr});
  return sections;
}

}  // namespace shardlm
