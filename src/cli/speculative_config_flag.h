// --speculative-config, vLLM's JSON, for generate and serve:
// '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}'.
#pragma once

#include <string>

#include "model/speculative.h"

namespace shardlm::cli {

// Every key is checked; one shardlm does not implement is refused, naming
// it ("model": draft models). "" gives disabled options. Throws kInvalidArgument
// / kUnsupported.
SpeculativeOptions parse_speculative_config(const std::string& text);

// The --help text of the flag, shared by both commands.
extern const char* const kSpeculativeConfigHelp;

}  // namespace shardlm::cli
