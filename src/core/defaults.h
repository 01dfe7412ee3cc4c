// Defaults shared by layers that must agree without depending on each other
// (plan sizes the KV pool that kv and sched manage).
#pragma once

#include <cstdint>

namespace shardlm {

inline constexpr int32_t kDefaultBlockSize = 16;  // tokens per KV block (vLLM's default)

}  // namespace shardlm
