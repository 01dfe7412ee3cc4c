// Applies a grammar's allowed-token bitmask to one row of logits.
#pragma once

#include <cstdint>
#include <span>

namespace shardlm {

// bitmask: bit t % 32 of word t / 32 set when token t is allowed (the
// layout grammar::GrammarMatcher fills). Disallowed tokens, and tokens past
// the mask's coverage, get -inf. logits: [vocab].
void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> bitmask);

}  // namespace shardlm
