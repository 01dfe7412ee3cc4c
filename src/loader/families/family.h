// A model family as the loader knows it: which architectures it reads, its
// own config.json fields (and what it refuses), and its tensor table, each
// tensor with its shard role (plan) and its slot (model). Adding a family is
// one file here, one in model/families/, and a line in registry.cpp.
//
// The fields every family has (sizes, heads, rope, dtype, quantization, eos)
// are parsed by parse_model_config before the family's parse_config runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loader/model_spec.h"

namespace shardlm {

struct FamilyDef {
  Family family;
  const char* name;          // "qwen2": model_type make-model writes
  const char* architecture;  // "Qwen2ForCausalLM"
  // The family's own fields of config.json into spec; throws kUnsupported
  // naming the field for anything shardlm does not run.
  void (*parse_config)(const nlohmann::json& config, ModelSpec& spec, const std::string& source);
  // The family's own fields of config.json as make-model writes them.
  void (*write_config)(const ModelSpec& spec, nlohmann::json& config);
  // The tensors of decoder layer `layer`, appended in a stable order.
  void (*layer_tensors)(const ModelSpec& spec, int64_t layer, std::vector<TensorSpec>& out);
  // A multimodal checkpoint whose language model is this family: the
  // language model's config.json fields as one flat object (its text_config
  // over the family's defaults, with the top level's dtype and token ids),
  // which parse_model_config then reads. nullptr: config.json is flat.
  nlohmann::json (*language_model_config)(const nlohmann::json& config, const std::string& source);
};

// The registry (registry.cpp): one entry per architecture.
const std::vector<const FamilyDef*>& family_defs();
const FamilyDef& family_def(Family family);
// nullptr for an architecture no family reads.
const FamilyDef* find_family(const std::string& architecture);

// ---- pieces the families' files share (common.cpp) --------------------------

// Appends the tensors of Linear `module` [n_out, n_in] as spec's quantization
// stores it: "<module>.weight" when the quantization_config does not cover
// it, else its parts (qweight, qzeros, scales, g_idx / fp8 weight and
// weight_scale_inv), each carrying the Linear's slot, role and space, so plan
// slices every part in the Linear's logical units. `layer` -1 for lm_head.
void append_linear_tensors(const ModelSpec& spec, const std::string& module, int64_t n_out, int64_t n_in,
                           TensorSlot slot, ShardRole role, ShardSpace space, int64_t expert, int64_t layer,
                           std::vector<TensorSpec>& out);

// One layer's tensor table under "<spec.tensor_prefix>model.layers.<layer>.".
class LayerTable {
 public:
  LayerTable(const ModelSpec& spec, int64_t layer, std::vector<TensorSpec>& out);
  // A vector or norm weight "<prefix><name>" of `shape`.
  void add(const std::string& name, std::vector<int64_t> shape, TensorSlot slot, ShardRole role = ShardRole::kReplicated,
           ShardSpace space = ShardSpace::kNone);
  // The tensors of Linear "<prefix><module>" [n_out, n_in] (its quantized
  // parts when the spec's quantization_config covers it).
  void linear(const std::string& module, int64_t n_out, int64_t n_in, TensorSlot slot, ShardRole role,
              ShardSpace space, int64_t expert = -1);
  // Linear "<prefix><module>" whose rows stack `parts` (kFusedParts); an
  // unquantized checkpoint only.
  void fused_linear(const std::string& module, std::vector<FusedPart> parts, int64_t n_in);
  const ModelSpec& spec() const { return spec_; }

 private:
  const ModelSpec& spec_;
  int64_t layer_;
  std::string prefix_;  // "model.layers.3."
  std::vector<TensorSpec>& out_;
};

// Pre-norm attention as Llama names it: input_layernorm, self_attn.{q,k,v,o}_proj,
// q/k/v biases when spec.qkv_bias, self_attn.{q,k}_norm when spec.qk_norm.
void llama_attention_tensors(LayerTable& t);
// post_attention_layernorm and mlp.{gate,up,down}_proj of intermediate_size.
void llama_mlp_tensors(LayerTable& t);

// Refuses hidden_act other than silu: the family's MLP is SwiGLU.
void require_silu(const nlohmann::json& config, const ModelSpec& spec, const std::string& source);
// Refuses attention_bias=true (biases on q, k, v and o_proj; shardlm has no o_proj bias).
void refuse_attention_bias(const nlohmann::json& config, const ModelSpec& spec, const std::string& source);
// Refuses mlp_bias=true.
void refuse_mlp_bias(const nlohmann::json& config, const std::string& source);
// Qwen-style sliding window (use_sliding_window from max_window_layers): refused when switched on.
void refuse_qwen_sliding_window(const nlohmann::json& config, const std::string& source);
// Mistral-style sliding window (transformers applies it to every layer
// whenever it is set): below max_position_embeddings, every layer of spec
// attends to the last sliding_window positions; null or larger: none.
void mistral_sliding_window(const nlohmann::json& config, ModelSpec& spec, const std::string& source);
// Writes spec's window back as that field (null when no layer has one).
void write_mistral_sliding_window(const ModelSpec& spec, nlohmann::json& config);
// Any other family: a sliding_window field that is set is refused by name
// (shardlm computes full attention and would silently differ).
void refuse_sliding_window_field(const nlohmann::json& config, const ModelSpec& spec, const std::string& source);

}  // namespace shardlm
