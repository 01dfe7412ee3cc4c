// What differs between model families, as data the shared layers read. Each
// family has its own file (qwen2.cpp, qwen3.cpp, llama.cpp) that checks the
// config for what it supports and says how its graph differs from the
// common pre-norm decoder: x += o_proj(attn(rope(q), rope(k), v)); x += down(silu(gate) × up).
#pragma once

#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "loader/model_spec.h"

namespace shardlm {

// A family's sparse MLP (the MoE block, model/moe_block.h): where its tensors
// sit under "model.layers.N." and how it routes. Layers that are not sparse
// (ModelSpec::is_moe_layer false) keep the dense MLP.
struct MoeGraph {
  bool enabled = false;
  std::string block;          // "mlp" (Qwen3-MoE), "block_sparse_moe" (Mixtral): router is BLOCK.gate.weight
  std::string gate, up, down; // expert E's matrices: BLOCK.experts.E.<gate|up|down>.weight
  int64_t n_experts = 0;
  int64_t top_k = 0;
  bool renormalize = false;   // routing weights divided by their sum over the chosen experts
};

struct FamilyGraph {
  const char* name = "";
  bool qkv_bias = false;  // Qwen2: q/k/v projections carry biases
  bool qk_norm = false;   // Qwen3: RMSNorm over each head of q and k, before RoPE
  backend::RopeConfig rope;
  MoeGraph moe;           // Qwen3-MoE, Mixtral
};

// Throws Error(kUnsupported) naming the field for what the CPU engine does not run.
FamilyGraph qwen2_graph(const ModelSpec& spec);
FamilyGraph qwen3_graph(const ModelSpec& spec);
FamilyGraph llama_graph(const ModelSpec& spec);  // Llama 3.x and Mistral
FamilyGraph qwen3_moe_graph(const ModelSpec& spec);
FamilyGraph mixtral_graph(const ModelSpec& spec);
FamilyGraph family_graph(const ModelSpec& spec);

// The rope config common to all families: theta, and "linear"/"llama3" scaling.
backend::RopeConfig rope_config(const ModelSpec& spec);

}  // namespace shardlm
