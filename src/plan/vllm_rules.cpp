#include "plan/vllm_rules.h"

#include "core/error.h"

namespace shardlm {

const char* vllm_attention_class(const ModelSpec& spec) {
  switch (spec.family) {
    case Family::kQwen2: return "Qwen2Attention (vllm/model_executor/models/qwen2.py)";
    case Family::kQwen3: return "Qwen3Attention (vllm/model_executor/models/qwen3.py)";
    case Family::kLlama: return "LlamaAttention (vllm/model_executor/models/llama.py)";
    case Family::kMistral: return "LlamaAttention (vllm/model_executor/models/llama.py, MistralForCausalLM)";
    case Family::kMixtral: return "MixtralAttention (vllm/model_executor/models/mixtral.py)";
    case Family::kQwen3Moe: return "Qwen3MoeAttention (vllm/model_executor/models/qwen3_moe.py)";
    case Family::kPhi3: return "LlamaAttention (vllm/model_executor/models/phi3.py, Phi3ForCausalLM)";
    case Family::kGemma3: return "Gemma3Attention (vllm/model_executor/models/gemma3.py)";
  }
  return "attention";
}

std::string hf_repo_id(const ModelSpec& spec, const std::string& hf_name) {
  if (hf_name.find('/') != std::string::npos) return hf_name;
  switch (spec.family) {
    case Family::kQwen2:
    case Family::kQwen3:
    case Family::kQwen3Moe: return "Qwen/" + hf_name;
    case Family::kLlama: return "meta-llama/" + hf_name;
    case Family::kMistral:
    case Family::kMixtral: return "mistralai/" + hf_name;
    case Family::kPhi3: return "microsoft/" + hf_name;
    case Family::kGemma3: return "google/" + hf_name;
  }
  return hf_name;
}

VllmVerdict vllm_check_layout(const ModelSpec& spec, const Layout& layout) {
  VllmVerdict v;
  const int64_t tp = layout.tp;
  if (spec.n_heads % tp != 0) {
    v.accepted = false;
    v.reason = str_cat("Total number of attention heads (", spec.n_heads, ") must be divisible by tensor parallel size (",
                       tp, ").");
    v.where = "ValueError in ModelConfig.verify_with_parallel_config (vllm/config.py)";
    v.rule = str_cat(spec.n_heads, " attention heads % TP ", tp, " = ", spec.n_heads % tp, ", not 0");
    return v;
  }
  const int64_t kv = spec.n_kv_heads;
  if (kv >= tp && kv % tp != 0) {
    v.accepted = false;
    v.reason = "AssertionError: assert self.total_num_kv_heads % tp_size == 0";
    v.where = str_cat("in ", vllm_attention_class(spec), ".__init__: tp <= KV heads, so vLLM partitions them");
    v.rule = str_cat(kv, " KV heads % TP ", tp, " = ", kv % tp, ", not 0");
    return v;
  }
  if (kv < tp && tp % kv != 0) {
    v.accepted = false;
    v.reason = "AssertionError: assert tp_size % self.total_num_kv_heads == 0";
    v.where = str_cat("in ", vllm_attention_class(spec), ".__init__: tp > KV heads, so vLLM replicates each KV head tp / ",
                      kv, " times");
    v.rule = str_cat("TP ", tp, " % ", kv, " KV heads = ", tp % kv, ", not 0");
    return v;
  }
  if (spec.is_moe() && !layout.expert_parallel && spec.moe_intermediate_size % tp != 0) {
    v.accepted = false;
    v.reason = "AssertionError: assert intermediate_size % self.tp_size == 0";
    v.where = "FusedMoE.__init__ (vllm/model_executor/layers/fused_moe/layer.py): without expert parallelism each expert is split over TP";
    v.rule = str_cat("moe_intermediate_size ", spec.moe_intermediate_size, " % TP ", tp, " = ",
                     spec.moe_intermediate_size % tp, ", not 0 (--enable-expert-parallel keeps experts whole)");
    return v;
  }
  // With expert parallelism vLLM's determine_expert_map gives the first
  // n_experts % ep ranks one expert more: any count over any degree is accepted.
  if (!spec.is_moe() || spec.n_moe_layers() < spec.n_layers) {
    const int64_t inter = spec.intermediate_size;
    int64_t bad = 0;
    if ((2 * inter) % tp != 0) bad = 2 * inter;
    else if (inter % tp != 0) bad = inter;
    if (bad != 0) {
      v.accepted = false;
      v.reason = str_cat("AssertionError: ", bad, " is not divisible by ", tp);
      v.where = "ensure_divisibility (vllm/distributed/utils.py) from ColumnParallelLinear of mlp.gate_up_proj";
      v.rule = str_cat("intermediate_size ", inter, (bad == inter ? "" : " × 2"), " % TP ", tp, " = ", bad % tp,
                       ", not 0");
      return v;
    }
  }
  if (layout.pp > spec.n_layers) {
    v.accepted = false;
    v.reason = str_cat("pipeline_parallel_size ", layout.pp, " leaves stages without layers (", spec.n_layers, " layers)");
    v.where = "get_pp_indices (vllm/distributed/utils.py)";
    v.rule = v.reason;
  }
  return v;
}

std::vector<int64_t> vllm_pp_partition(int64_t n_layers, int pp) {
  SHARDLM_CHECK(pp >= 1);
  std::vector<int64_t> parts(pp, n_layers / pp);
  const int64_t remaining = n_layers % pp;
  // for i in range(2, remaining_layers + 2): partitions[-i] += 1
  for (int64_t i = 2; i < remaining + 2; ++i) parts[pp - i] += 1;
  return parts;
}

}  // namespace shardlm
