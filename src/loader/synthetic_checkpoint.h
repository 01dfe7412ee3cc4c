// Synthetic checkpoints: a complete Hugging Face model directory with the
// shapes of a real model (from the catalog, optionally overridden) and seeded
// random weights. Like vLLM's "dummy" load format, but written to disk, so
// every reader (shardlm, the Python reference, transformers) sees the same
// bytes. The directory holds config.json, generation_config.json,
// model.safetensors (or K shards + model.safetensors.index.json),
// tokenizer.json and tokenizer_config.json.
//
// Quantized checkpoints (--quantize): every decoder Linear is stored as its
// quantization of the weight the unquantized checkpoint of the same seed
// holds under "<module>.weight" (before rounding to the dtype), so the two
// checkpoints stand for the same model up to the quantization error.
//
// Weights. Element i of tensor T is center + std * sqrt(3) * u, with u
// uniform in [-1, 1) taken from splitmix64(key(seed, T) + i), key =
// splitmix64(seed ^ fnv1a64(T's name)). A counter-based generator: the value
// of every element depends only on (seed, name, i), so generation is
// parallel (threads) and streamed to disk in chunks, and any subset of a
// checkpoint can be regenerated. Uniform noise with the stated std:
//   Linear weights [out, in]     std 1/sqrt(in)       (activations stay O(1))
//   q/k/v biases                 std 0.1
//   RMSNorm weights (all)        1 + std 0.05
//   embed_tokens (untied)        std 1                (residual stream O(1))
//   lm_head, embed when tied     std 2/sqrt(hidden)   (logits std ~2: the
//                                greedy top-1/top-2 margin is typically
//                                > 0.1, far above f32 summation-order noise)
//   rows of lm_head (and of the tied embedding) for ids >= the tokenizer's
//   vocabulary are zero: their logits are exactly 0, below the best of the
//   >= 259 real tokens (std 2), so greedy decoding emits decodable ids even
//   when --vocab leaves ids without a token. (Sampling at temperature 1 can
//   still pick them; use --vocab = the tokenizer size to have none.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "loader/model_spec.h"

namespace shardlm {

struct SyntheticModelOptions {
  std::string like = "qwen2.5-7b";  // catalog name (model_catalog.h)
  int64_t n_layers = 2;             // 0: the catalog's
  int64_t vocab_size = 0;           // 0: the catalog's
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  int n_shards = 1;
  // Shape overrides; 0 keeps the catalog value. When hidden_size or n_heads
  // is overridden and head_dim is not, head_dim = hidden_size / n_heads.
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  std::optional<bool> tie_word_embeddings;  // unset: the catalog's
  int64_t sliding_window = 0;               // local layers' window (Gemma 3); 0: the catalog's
  double final_logit_softcapping = 0.0;     // Gemma 3's final_logit_softcapping; 0: the catalog's (null)
  // LongRoPE: original_max_position_embeddings, where the long factors take
  // over (max_position_embeddings keeps its ratio to it); 0: the catalog's.
  int64_t original_max_position = 0;
  // MoE reductions (0 / unset keeps the catalog value): experts per layer,
  // experts per token, each expert's width (Mixtral: intermediate_size, which
  // --intermediate also sets), and Qwen3-MoE's dense-layer placement.
  int64_t n_experts = 0;
  int64_t n_experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t decoder_sparse_step = 0;
  std::optional<std::vector<int64_t>> mlp_only_layers;
  std::optional<bool> norm_topk_prob;  // Qwen3-MoE only (Mixtral always renormalises)
  // Quantized checkpoint in a published layout (loader/quant_config.h), made
  // by round-to-nearest of the same seeded weights (loader/quant_pack.h):
  // "" (none), "awq", "gptq" (4-bit), "gptq-int8", "fp8". Unquantized
  // tensors (embeddings, norms, biases, lm_head) stay in `dtype`.
  std::string quantize;
  int64_t group_size = 128;  // awq / gptq
  bool desc_act = false;     // gptq act-order (g_idx a permutation's groups)
  bool sym = true;           // gptq
  // gptq: quantize lm_head too ("lm_head": true, GPTQModel's layout). A tied
  // catalog model is written untied (GPTQModel quantizes untied lm_heads
  // only): lm_head gets its own weights, as with tie_word_embeddings=false.
  bool quantize_lm_head = false;
};

// The quantization_config make-model writes for options.quantize; method
// kNone for "". Throws Error(kInvalidArgument) naming --quantize,
// --group-size, --desc-act, --asym or --lm-head when they do not fit together.
QuantConfig synthetic_quant_config(const SyntheticModelOptions& options);

// The spec make-model writes: catalog shape, overrides, bos/eos set to the
// synthetic tokenizer's <|endoftext|> / <|im_end|> ids. Throws
// Error(kInvalidArgument) naming the option (--heads, --vocab, ...) when a
// value is out of range, Error(kNotFound) for an unknown catalog name,
// Error(kInvalidArgument) for an MoE option on a dense model.
ModelSpec synthetic_model_spec(const SyntheticModelOptions& options);

// The tensors written, in expected_tensors order (lm_head omitted when tied).
std::vector<TensorSpec> synthetic_tensor_list(const ModelSpec& spec);

// The value of element i of a tensor (before rounding to the dtype, and
// before the zeroing of unused output rows).
float synthetic_weight_value(uint64_t seed, const std::string& tensor_name, int64_t hidden_size,
                             const std::vector<int64_t>& shape, bool tied, int64_t i);

struct SyntheticModelResult {
  ModelSpec spec;
  std::vector<std::string> weight_files;  // file names inside the directory
  uint64_t total_size = 0;                // tensor bytes
  int64_t tokenizer_vocab = 0;            // ids the tokenizer uses (<= spec.vocab_size)
  int64_t n_merges = 0;
};

// Writes the directory (created if missing; existing files of the same
// names are replaced). Throws Error(kIo) naming the path on write failures.
SyntheticModelResult write_synthetic_model(const std::filesystem::path& dir, const SyntheticModelOptions& options);

}  // namespace shardlm
