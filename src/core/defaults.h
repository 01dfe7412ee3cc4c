// Defaults shared by layers that must agree without depending on each other
// (plan sizes the KV pool that kv and sched manage).
#pragma once

#include <cstdint>

namespace shardlm {

inline constexpr int32_t kDefaultBlockSize = 16;  // tokens per KV block (vLLM's default)

// tokenizer.json / tokenizer_config.json larger than this are refused by the
// tokenizer at load and by verify (loader), instead of being read whole:
// real ones are 2-20 MB, and parsing costs about 3x the file in memory.
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(256) << 20;

}  // namespace shardlm
