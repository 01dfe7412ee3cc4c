// What vLLM would say about a layout: its divisibility checks, quoted from its
// source (vLLM 0.6–0.10), and its pipeline split. plan prints these next to
// shardlm's own verdict (shardlm accepts any TP degree up to n_heads).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loader/model_spec.h"
#include "plan/sharding.h"

namespace shardlm {

struct VllmVerdict {
  bool accepted = true;
  std::string reason;  // vLLM's own error text, empty when accepted
  std::string where;   // the vLLM source that raises it
  std::string rule;    // the rule in words: "28 attention heads % TP 6 = 4, not 0"
};

// Checks in the order vLLM meets them when it starts:
//  1. ModelConfig.verify_with_parallel_config (vllm/config.py): ValueError
//     "Total number of attention heads (28) must be divisible by tensor parallel size (6)."
//  2. The family's attention __init__ (e.g. Qwen2Attention in vllm/model_executor/models/qwen2.py):
//     tp <= n_kv_heads partitions KV heads and asserts n_kv_heads % tp == 0;
//     tp > n_kv_heads replicates them and asserts tp % n_kv_heads == 0 (a bare AssertionError).
//  3. MergedColumnParallelLinear (gate_up_proj) → ColumnParallelLinear:
//     divide(2 × intermediate_size, tp) then divide(intermediate_size, tp), whose
//     ensure_divisibility (vllm/distributed/utils.py) raises "18944 is not divisible by 7".
//     (dense layers only; a MoE model's dense layers when mlp_only_layers / decoder_sparse_step make some).
//  4. MoE without expert parallelism: FusedMoE.__init__ (vllm/model_executor/layers/fused_moe/layer.py)
//     asserts moe_intermediate_size % tp == 0. With --enable-expert-parallel,
//     determine_expert_map splits experts unevenly when it must (base + 1 on the
//     first n_experts % ep ranks), so any expert count is accepted.
// Pipeline parallelism: every family in the catalog implements SupportsPP; any
// pp <= n_layers is accepted with vllm_pp_partition's split.
VllmVerdict vllm_check_layout(const ModelSpec& spec, const Layout& layout);

// vLLM's get_pp_indices (vllm/distributed/utils.py): n_layers // pp per stage,
// the remainder one each to the stages before the last, counting backwards
// (28 layers, pp 3: [9, 10, 9]; 80 layers, pp 3: [27, 27, 26]).
// VLLM_PP_LAYER_PARTITION="a,b,c" overrides it.
std::vector<int64_t> vllm_pp_partition(int64_t n_layers, int pp);

// The attention class vLLM builds for this family ("Qwen2Attention").
const char* vllm_attention_class(const ModelSpec& spec);
// "Qwen/Qwen2.5-7B-Instruct" for a catalog hf_name, by family.
std::string hf_repo_id(const ModelSpec& spec, const std::string& hf_name);

}  // namespace shardlm
