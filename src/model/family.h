// What differs between model families, as data the shared layers read. Each
// family has its own file (qwen2.cpp, qwen3.cpp, llama.cpp) that checks the
// config for what it supports and says how its graph differs from the
// common pre-norm decoder: x += o_proj(attn(rope(q), rope(k), v)); x += down(silu(gate) × up).
#pragma once

#include "backend/ops.h"
#include "loader/model_spec.h"

namespace shardlm {

struct FamilyGraph {
  const char* name = "";
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry biases
  bool qk_norm = false;   // Qwen3: RMSNorm over each head of q and k, before RoPE
  backend::RopeConfig rope;
};

// Throws Error(kUnsupported) naming the field for what the CPU engine does not run.
FamilyGraph qwen2_graph(const ModelSpec& spec);
FamilyGraph qwen3_graph(const ModelSpec& spec);
FamilyGraph llama_graph(const ModelSpec& spec);  // Llama 3.x and Mistral
FamilyGraph family_graph(const ModelSpec& spec);

// The rope config common to all families: theta, and "linear"/"llama3" scaling.
backend::RopeConfig rope_config(const ModelSpec& spec);

}  // namespace shardlm
