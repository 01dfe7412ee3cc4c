// ModelSpec: what config.json says about a model, normalised across families.
// plan, verify, make-model and the model code all start from this value.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "loader/quant_config.h"

namespace shardlm {

enum class Family {
  kQwen2,    // Qwen2ForCausalLM (Qwen2, Qwen2.5): q/k/v biases, no field says so
  kQwen3,    // Qwen3ForCausalLM: q_norm/k_norm per head, explicit head_dim
  kLlama,    // LlamaForCausalLM (Llama 3.x, rope_scaling llama3)
  kMistral,  // MistralForCausalLM: the Llama graph
  kMixtral,  // MixtralForCausalLM: sparse MoE, softmax over the top-k logits
  kQwen3Moe, // Qwen3MoeForCausalLM: sparse MoE, top-k of the softmax, norm_topk_prob
  kPhi3,     // Phi3ForCausalLM (Phi-3, Phi-4): fused qkv_proj and gate_up_proj
  kGemma3,   // Gemma3ForCausalLM (gemma3_text): sliding-window local layers, (1 + w) norms, GeGLU
};

// The gated MLP's activation: down(act(gate(x)) × up(x)).
enum class MlpActivation {
  kSilu,      // SwiGLU (every family but Gemma)
  kGeluTanh,  // GeGLU with PyTorch's tanh approximation (gelu_pytorch_tanh)
};

const char* family_name(Family family);

struct RopeScaling {
  std::string type;  // "" (none), "llama3", "linear", "longrope" (Phi-3's "su" too)
  double factor = 1.0;
  double low_freq_factor = 1.0;    // llama3
  double high_freq_factor = 4.0;   // llama3
  int64_t original_max_position_embeddings = 8192;
  // longrope: per rotary frequency, the divisor up to and past
  // original_max_position_embeddings; cos and sin times attention_factor.
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;
};

struct ModelSpec {
  std::string architecture;  // "Qwen2ForCausalLM"
  std::string model_type;    // "qwen2"
  Family family = Family::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // Q heads
  int64_t n_kv_heads = 0;  // K/V heads (GQA groups)
  int64_t head_dim = 0;    // hidden_size / n_heads unless config.json says otherwise
  // Rotary embeddings turn the first rotary_dim dims of each head (Phi's
  // partial_rotary_factor × head_dim); the rest pass through.
  double partial_rotary_factor = 1.0;
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2: biases on q/k/v projections
  bool qk_norm = false;   // Qwen3: RMSNorm over each head of q and k
  MlpActivation mlp_activation = MlpActivation::kSilu;
  // Every RMSNorm multiplies by (norm_weight_offset + w): 1 for Gemma, which
  // stores w for the factor 1 + w; 0 elsewhere.
  float norm_weight_offset = 0.0f;
  // Gemma: the embeddings are multiplied by sqrt(hidden_size), rounded to
  // the checkpoint dtype as transformers does (34.0 for 1152 in bf16).
  bool scale_embeddings = false;
  // q·k is scaled by query_pre_attn_scalar^-0.5 (Gemma 3); 0: head_dim^-0.5.
  double query_pre_attn_scalar = 0.0;
  // Gemma's final_logit_softcapping c: logits = c × tanh(logits / c), after
  // the lm_head and before sampling; 0: none.
  double final_logit_softcapping = 0.0;
  // Sliding-window attention: layer l with sliding_layers[l] attends to the
  // last sliding_window positions only (itself included), with rope base
  // rope_local_theta and no rope scaling when rope_local_theta > 0 (Gemma 3's
  // local layers). Empty sliding_layers: every layer attends to all of its past.
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  double rope_local_theta = 0.0;
  // Mixture of experts (model/layers.h moe() runs them; plan/moe_accounting.h sizes them).
  int64_t n_experts = 0;              // num_experts (Qwen3-MoE) / num_local_experts (Mixtral)
  int64_t n_experts_per_token = 0;    // num_experts_per_tok (top-k)
  int64_t moe_intermediate_size = 0;  // each expert's MLP width (Mixtral: intermediate_size)
  // Routing weights of the chosen experts are renormalised to sum to 1.
  // Mixtral always (softmax over the top-k logits); Qwen3-MoE when norm_topk_prob.
  bool norm_topk_prob = false;
  // Qwen3-MoE: layer l is sparse when (l + 1) % decoder_sparse_step == 0 and l is
  // not in mlp_only_layers; other layers carry a dense MLP of intermediate_size.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  DType dtype = DType::kBF16;  // torch_dtype: unquantized tensors (and activations)
  QuantConfig quant;           // quantization_config (method kNone when absent)
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // The language model of a multimodal checkpoint (Gemma3ForConditionalGeneration):
  // every tensor name starts with tensor_prefix ("language_model."), and
  // tensors under ignored_tensor_prefixes (the vision tower) are not loaded.
  std::string tensor_prefix;
  std::vector<std::string> ignored_tensor_prefixes;

  // What bounds a sequence's positions, for messages.
  std::string max_position_source() const;
  // LongRoPE (transformers' rule): a forward whose positions reach past
  // original_max_position_embeddings rotates with the long factors, and what
  // it cached before keeps the short ones. So a sequence whose prompt of
  // n_prompt tokens is longer rotates every position with the long factors,
  // and a shorter one switches at original_max_position_embeddings.
  // long_context(n_prompt) says which; false for every other rope.
  bool long_context(int64_t n_prompt) const {
    return rope_scaling.type == "longrope" && n_prompt > rope_scaling.original_max_position_embeddings;
  }
  // The first position that always rotates with LongRoPE's long factors
  // (original_max_position_embeddings); 0 for every other rope.
  int64_t long_rope_from() const {
    return rope_scaling.type == "longrope" ? rope_scaling.original_max_position_embeddings : 0;
  }
  bool is_moe() const { return n_experts > 0; }
  bool is_sliding_layer(int64_t layer) const {
    return layer >= 0 && static_cast<size_t>(layer) < sliding_layers.size() && sliding_layers[static_cast<size_t>(layer)];
  }
  // True when decoder layer `layer` holds experts (false for every layer of a dense model).
  bool is_moe_layer(int64_t layer) const;
  // Decoder layers that hold experts.
  int64_t n_moe_layers() const;
  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t group_size() const { return n_heads / n_kv_heads; }  // Q heads per KV head
};

// Parses a config.json object. `source` names the file in error messages.
// Throws Error(kUnsupported) for unknown architectures, Error(kInvalidArgument)
// for missing or inconsistent fields, naming the field.
ModelSpec parse_model_config(const nlohmann::json& config, const std::string& source);
// Reads and parses a config.json file.
ModelSpec load_model_config(const std::filesystem::path& config_json);
// The config.json object for a spec (what make-model writes).
nlohmann::json model_config_json(const ModelSpec& spec);

// The role of a tensor that stores part of a quantized Linear.
enum class QuantPart {
  kNone,      // an ordinary tensor in the checkpoint dtype
  kQWeight,   // awq/gptq packed int32 weights
  kQZeros,    // awq/gptq packed int32 zero points
  kScales,    // awq/gptq scales per (group, output channel)
  kGIdx,      // gptq group of each input row
  kFp8Weight, // fp8 E4M3 weights [out, in]
  kScaleInv,  // fp8 dequantization multipliers
};
const char* quant_part_name(QuantPart part);  // "qweight", "qzeros", "scales", "g_idx", "weight", "weight_scale_inv"

// How plan shards a tensor over the tensor-parallel ranks of a stage
// (Megatron's names: a column-parallel Linear [out, in] splits its output
// features, dim 0; a row-parallel one its input features, dim 1). plan
// switches on it and never reads a Hugging Face name.
enum class ShardRole {
  kReplicated,    // every rank holds all of it (norms)
  kColumn,        // dim 0 split over `space` (q/k/v, gate/up; their biases)
  kRow,           // dim 1 split over `space`; partial outputs all-reduced (o_proj, down_proj)
  kVocab,         // rows of the vocabulary (embed_tokens, lm_head)
  kExpertColumn,  // expert `expert`'s gate/up: on the ranks holding the expert, dim 0 over its intermediate
  kExpertRow,     // expert `expert`'s down: dim 1 over its intermediate
  kRouter,        // an MoE router [n_experts, hidden]: replicated
  kFusedParts,    // rows of several column-parallel Linears stacked ([Σ rows, in]: Phi-3's qkv_proj,
                  // gate_up_proj): each part split over its own space, a rank holding its slice of every part
};
const char* shard_role_name(ShardRole role);  // "replicated", "column", ...

// What a column or row split divides: heads (× head_dim) or MLP columns.
enum class ShardSpace {
  kNone,
  kQHeads,        // Q heads: q_proj rows, o_proj columns
  kKvHeads,       // the KV heads a rank's Q heads use: k_proj/v_proj rows
  kIntermediate,  // the dense MLP's intermediate columns
};

// What a tensor is to the model's graph: model/ places weights by slot and
// never reads a Hugging Face name either (loader/families/ owns the names).
enum class TensorSlot {
  kEmbedding,   // [vocab, hidden]; first stage (and the last, when tied)
  kFinalNorm,   // [hidden]; last stage
  kLmHead,      // [vocab, hidden]; last stage
  kAttnNorm,    // [hidden] before attention
  kPostAttnNorm,  // [hidden] over attention's output, before the residual add (Gemma)
  kPostMlpNorm,   // [hidden] over the MLP's output, before the residual add (Gemma)
  kQ, kK, kV,   // projections [q_dim | kv_dim, hidden]
  kQBias, kKBias, kVBias,
  kQNorm, kKNorm,  // [head_dim] per-head RMSNorm
  kO,           // [hidden, q_dim]
  kMlpNorm,     // [hidden] before the MLP / MoE block
  kGate, kUp, kDown,                      // dense MLP
  kRouter,                                // [n_experts, hidden]
  kExpertGate, kExpertUp, kExpertDown,    // expert `expert`'s MLP
};
const char* tensor_slot_name(TensorSlot slot);  // "q", "expert_down", ...

// One part of a kFusedParts tensor: `rows` consecutive rows (after the
// previous parts') that are the Linear of `slot`, split over `space`.
struct FusedPart {
  TensorSlot slot = TensorSlot::kQ;
  ShardSpace space = ShardSpace::kNone;
  int64_t rows = 0;
};

// One tensor of a Hugging Face checkpoint, by its HF name.
struct TensorSpec {
  TensorSpec() = default;
  TensorSpec(std::string name_, std::vector<int64_t> shape_, bool optional_ = false, int64_t layer_ = -1)
      : name(std::move(name_)), shape(std::move(shape_)), optional(optional_), layer(layer_) {}

  std::string name;            // "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // row-major, PyTorch's [out_features, in_features] for Linear
  bool optional = false;       // may be absent (lm_head.weight of a tied model)
  int64_t layer = -1;          // decoder layer index, -1 for embed/norm/lm_head
  // Quantized storage (see loader/quant_config.h for the layouts). Empty
  // dtypes: the checkpoint's own dtype, shared by all such tensors.
  std::vector<DType> dtypes;                       // accepted storage dtypes, first = what make-model writes
  std::vector<std::vector<int64_t>> other_shapes;  // also accepted (fp8 per-tensor / per-channel scales)
  QuantPart part = QuantPart::kNone;
  std::string module;        // a Linear's tensors (every part): "model.layers.0.self_attn.q_proj"
  int64_t out_features = 0;  // quantized parts: the logical Linear is [out_features, in_features]
  int64_t in_features = 0;
  // Sharding and meaning, set by the family's tensor table (loader/families/).
  ShardRole role = ShardRole::kReplicated;
  ShardSpace space = ShardSpace::kNone;  // kColumn / kRow: what the split divides
  TensorSlot slot = TensorSlot::kAttnNorm;
  int64_t expert = -1;  // expert tensors and their quantized parts: the expert's id
  std::vector<FusedPart> fused;  // kFusedParts: the parts, in row order
  // The first (or only) tensor of a Linear: where the model assembles it
  // (the .weight of an unquantized one, qweight / the fp8 weight otherwise).
  bool primary() const {
    return part == QuantPart::kNone || part == QuantPart::kQWeight || part == QuantPart::kFp8Weight;
  }
};

// Every tensor a checkpoint of this spec holds, in a stable order. For a tied
// model lm_head.weight is listed as optional (Qwen3-0.6B ships one anyway).
// MoE families list their expert tensors so plan can count them exactly.
std::vector<TensorSpec> expected_tensors(const ModelSpec& spec);

// Refuses a quantized spec whose Linear dimensions the layout cannot hold
// (in_features not a multiple of group_size or of the pack factor, ...),
// naming the tensor, the dimension and the quantization_config field.
// parse_model_config calls it.
void check_quantized_shapes(const ModelSpec& spec, const std::string& source);

// Elements of a shape (product of dims; 1 for a scalar).
int64_t shape_numel(const std::vector<int64_t>& shape);
// "[512, 3584]"
std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace shardlm
