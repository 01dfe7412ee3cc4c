// Regular expressions (the common subset of ECMAScript and Python syntax
// that JSON Schema `pattern` and vLLM's guided_regex use) compiled into the
// byte-level NFA. Matching is full-match: the text must match the whole
// pattern (leading ^ and trailing $ are accepted and mean the same).
//
// Supported: literals (UTF-8), . (any code point but \n), classes [a-z] [^...]
// with \d \w \s inside, escapes \d \D \w \W \s \S \n \r \t \f \v \0 \xHH
// \uHHHH and escaped punctuation, groups ( ) (?: ) (?<name> ) (?P<name> ),
// alternation |, quantifiers * + ? {n} {n,} {n,m} (a lazy ? suffix is
// accepted: it changes nothing about which texts match).
// Refused with Error(kUnsupported) naming the construct: backreferences,
// lookaround, \b \B, anchors inside the pattern, inline flags, possessive
// quantifiers.
#pragma once

#include <cstdint>
#include <string_view>

#include "grammar/nfa.h"

namespace shardlm::grammar {

struct RegexOptions {
  // The match is the content of a JSON string: code points the pattern
  // allows that JSON must escape (", \, controls) are emitted escaped.
  bool json_string = false;
  std::string_view what = "regex";  // names the pattern in errors ("#/properties/zip/pattern")
};

// Builds the pattern's fragment leading to next; returns its start.
// Throws Error(kInvalidArgument) for malformed patterns, kUnsupported for
// constructs listed above.
int32_t compile_regex(NfaBuilder& builder, std::string_view pattern, int32_t next, const RegexOptions& options = {});

}  // namespace shardlm::grammar
