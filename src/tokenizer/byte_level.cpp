#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace shardlm::byte_level {

namespace {

struct Tables {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 512> to_byte;  // code point -> byte, -1 if not a stand-in

  Tables() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? b : next++;
      utf8::append(to_char[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& byte_to_char(uint8_t b) { return tables().to_char[b]; }

void encode(std::string_view bytes, std::string& out) {
  const auto& t = tables();
  for (char c : bytes) out.append(t.to_char[static_cast<uint8_t>(c)]);
}

bool decode(std::string_view text, std::string& out) {
  const auto& t = tables();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t n = utf8::sequence_length(text, pos);
    if (n == 0 || n > 2) return false;  // stand-ins are all below U+0800
    uint32_t cp = utf8::decode_at(text, pos, n);
    if (cp >= t.to_byte.size() || t.to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(t.to_byte[cp]));
    pos += n;
  }
  return true;
}

}  // namespace shardlm::byte_level
