// GPT-2 byte-level mapping: every byte 0..255 gets a printable code point
// (printable Latin-1 bytes map to themselves, the rest to U+0100..U+0143), so
// BPE vocabularies can spell arbitrary bytes as text ("Ġ" is the space byte).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardlm::byte_level {

// The UTF-8 spelling of the code point that stands for byte b.
const std::string& byte_to_char(uint8_t b);

// Appends the byte-level spelling of every byte of bytes.
void encode(std::string_view bytes, std::string& out);

// Maps a byte-level string back to bytes. Returns false (out unspecified)
// when a character is not one of the 256 stand-ins.
bool decode(std::string_view text, std::string& out);

}  // namespace shardlm::byte_level
