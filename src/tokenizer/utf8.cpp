#include "tokenizer/utf8.h"

namespace shardlm::utf8 {

namespace {

// For a lead byte: total length and the allowed range of the second byte
// (Unicode Table 3-7), which rules out overlongs, surrogates and > U+10FFFF.
struct LeadInfo {
  uint8_t length;
  uint8_t lo;
  uint8_t hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Bytes from pos that are a valid prefix of some sequence (>= 1 even when
// the lead byte is invalid, so that callers always advance).
size_t maximal_subpart(std::string_view text, size_t pos, bool* complete) {
  auto b = static_cast<uint8_t>(text[pos]);
  LeadInfo info = lead_info(b);
  *complete = false;
  if (info.length == 0) return 1;
  if (info.length == 1) {
    *complete = true;
    return 1;
  }
  size_t n = 1;
  while (n < info.length && pos + n < text.size()) {
    auto c = static_cast<uint8_t>(text[pos + n]);
    bool ok = n == 1 ? (c >= info.lo && c <= info.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return n;
    ++n;
  }
  *complete = n == info.length;
  return n;
}

}  // namespace

size_t sequence_length(std::string_view text, size_t pos) {
  bool complete = false;
  size_t n = maximal_subpart(text, pos, &complete);
  return complete ? n : 0;
}

bool is_valid(std::string_view text, size_t* error_offset) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t n = sequence_length(text, pos);
    if (n == 0) {
      if (error_offset) *error_offset = pos;
      return false;
    }
    pos += n;
  }
  return true;
}

std::string lossy(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    bool complete = false;
    size_t n = maximal_subpart(text, pos, &complete);
    if (complete)
      out.append(text.substr(pos, n));
    else
      out.append(kReplacement);
    pos += n;
  }
  return out;
}

size_t incomplete_tail(std::string_view text) {
  // A sequence is at most 4 bytes, so an unfinished one starts in the last 3.
  size_t start = text.size() >= 3 ? text.size() - 3 : 0;
  for (size_t pos = start; pos < text.size(); ++pos) {
    auto b = static_cast<uint8_t>(text[pos]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation: not a start
    bool complete = false;
    size_t n = maximal_subpart(text, pos, &complete);
    if (!complete && pos + n == text.size() && lead_info(b).length > 1) return n;
  }
  return 0;
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t decode_at(std::string_view text, size_t pos, size_t n) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(text[pos + i])); };
  switch (n) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

}  // namespace shardlm::utf8
