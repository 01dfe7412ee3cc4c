// JSON Schema (and "any JSON object") to the byte-level NFA.
//
// The subset: what OpenAI's strict structured outputs allow and more —
// type (object/array/string/number/integer/boolean/null, or a list of them),
// properties, required, additionalProperties (false; true or a schema only
// for objects without `properties`), enum, const, anyOf, allOf with one
// member, $ref to "#", "#/$defs/..." or "#/definitions/...", items,
// minItems/maxItems, minLength/maxLength, pattern, format (date, time,
// date-time, email, uuid, ipv4), integer and number minimum/maximum/
// exclusiveMinimum/exclusiveMaximum of up to 18 integer digits (built digit
// by digit; a bounded number has no exponent), integer multipleOf over at
// most kMaxEnumeratedRange multiples between a minimum and a maximum, and a
// number's multipleOf 10^-k (at most k fraction digits, no exponent).
// Annotations (title, description, default, examples, $schema, $id, $comment,
// deprecated, readOnly, writeOnly) are ignored. Any other keyword is refused
// with Error(kUnsupported) naming it and where it is.
//
// Properties are emitted in the order the schema lists them; optional ones
// may be left out. Numbers have at most kMaxIntegerDigits digits before the
// point, kMaxFractionDigits after it and a two-digit exponent, so that a model
// cannot grow a number forever. Recursion (a $ref cycle, or the nested values
// of an any-JSON object) is unrolled up to options.max_depth levels; beyond
// that only the non-recursive alternatives remain.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "grammar/nfa.h"

namespace shardlm::grammar {

constexpr int kMaxIntegerDigits = 15;
constexpr int kMaxFractionDigits = 15;
constexpr int64_t kMaxEnumeratedRange = 1000;

struct JsonOptions {
  // Compact: exactly ", " between items and ": " after keys, nothing else
  // (xgrammar's any_whitespace=False; json.dumps' own layout). Otherwise up
  // to max_whitespace of space, \n, \t, \r wherever JSON allows whitespace.
  bool compact = true;
  int max_whitespace = 8;
  int max_depth = 6;  // nesting levels for recursive structures
};

// The fragment matching one value valid against `schema` (a JSON Schema
// document: an object or a boolean), leading to next.
int32_t json_schema_fragment(NfaBuilder& builder, const nlohmann::ordered_json& schema, const JsonOptions& options,
                             int32_t next);

// The fragment matching any JSON object (response_format json_object).
int32_t json_object_fragment(NfaBuilder& builder, const JsonOptions& options, int32_t next);


// The fragment matching the JSON value `value` (serialised with the
// options' separators).
int32_t json_literal_fragment(NfaBuilder& builder, const nlohmann::ordered_json& value, const JsonOptions& options,
                              int32_t next);

}  // namespace shardlm::grammar
