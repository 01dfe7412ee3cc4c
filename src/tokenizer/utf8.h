// UTF-8 helpers shared by the tokenizer: validation, lossy repair (U+FFFD),
// and the complete-prefix test the streaming decoder needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace shardlm::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed sequence starting at text[pos], or 0 when the
// bytes there are not one (invalid lead, bad continuation, overlong,
// surrogate, > U+10FFFF, or truncated by the end of text).
size_t sequence_length(std::string_view text, size_t pos);

// True when text is well-formed UTF-8; otherwise *error_offset (if given)
// receives the byte offset of the first bad sequence.
bool is_valid(std::string_view text, size_t* error_offset = nullptr);

// Copies text, replacing each maximal ill-formed subpart with U+FFFD (the
// Unicode "best practice" that Rust's from_utf8_lossy and WHATWG use).
std::string lossy(std::string_view text);

// Bytes at the end of text that form a valid but unfinished sequence (a
// lead byte and fewer continuation bytes than it announces): 0..3.
size_t incomplete_tail(std::string_view text);

// Appends code point cp (must be <= 0x10FFFF) as UTF-8.
void append(std::string& out, uint32_t cp);

// Decodes the well-formed sequence of length n at text[pos].
uint32_t decode_at(std::string_view text, size_t pos, size_t n);

}  // namespace shardlm::utf8
