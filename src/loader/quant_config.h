// quantization_config: how a published quantized checkpoint stores its Linear
// weights. Read from config.json's "quantization_config" (AWQ, GPTQ, FP8 as
// transformers writes them) or, for older GPTQ checkpoints, from a separate
// quantize_config.json. Every field is validated: a method, bit width or
// field shardlm does not run is refused before any weight is read, naming the
// field, the value found and the values supported. Nothing is silently
// treated as BF16.
//
// Storage layouts (K = in_features, N = out_features, g = group_size,
// G = number of groups), as the published repositories hold them:
//   AWQ (AutoAWQ GEMM, 4-bit, zero points):
//     qweight [K, N/8] I32    8 output channels per word; nibble i of word c
//                             holds channel 8c + kAwqPackOrder[i]
//     qzeros  [K/g, N/8] I32  the same packing of the 4-bit zero points
//     scales  [K/g, N] F16
//     w[k, n] = (q[k, n] - z[k/g, n]) * s[k/g, n]
//   GPTQ (AutoGPTQ / GPTQModel, 4- or 8-bit, b = bits, p = 32/b):
//     qweight [K/p, N] I32    sequential along the input dim: bits
//                             [b*j, b*j+b) of word r hold row p*r + j
//     qzeros  [G, N/p] I32    sequential along the output dim
//     scales  [G, N] F16
//     g_idx   [K] I32         group of each input row (k/g unless desc_act)
//     w[k, n] = (q[k, n] - (z[g_idx[k], n] + o)) * s[g_idx[k], n], where
//     o = 1 for checkpoint_format "gptq" (the stored zero is zero - 1) and
//     0 for "gptq_v2". G = ceil(K/g), or 1 when group_size is -1.
//   FP8 (transformers fine-grained FP8, E4M3):
//     weight           [N, K] F8_E4M3
//     weight_scale_inv [ceil(N/bn), ceil(K/bk)] F32 or BF16 for
//                      weight_block_size [bn, bk]; without a block size
//                      [] or [1] (per tensor) or [N] or [N, 1] (per channel)
//     w[n, k] = fp8(weight[n, k]) * scale_inv[n/bn, k/bk]
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"

namespace shardlm {

enum class QuantMethod { kNone, kAwq, kGptq, kFp8 };

// "none", "awq", "gptq", "fp8"
const char* quant_method_name(QuantMethod method);

// AutoAWQ's order of output channels inside a packed int32 word: nibble i
// holds channel kAwqPackOrder[i] of the word's 8.
constexpr int kAwqPackOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

struct QuantConfig {
  QuantMethod method = QuantMethod::kNone;
  std::string source;     // where it was read: "config.json quantization_config", "quantize_config.json"
  int bits = 0;           // awq 4; gptq 4 or 8; fp8 8
  int64_t group_size = 0; // awq/gptq input rows per group; gptq -1: one group over all rows
  bool zero_point = true; // awq zero_point (must be true)
  bool sym = true;        // gptq
  bool desc_act = false;  // gptq act-order: g_idx is a permutation's groups, not k/g
  int zero_offset = 1;    // gptq: added to the stored zero (1 for "gptq", 0 for "gptq_v2")
  std::string checkpoint_format;             // gptq: "gptq" or "gptq_v2"
  std::vector<int64_t> weight_block_size;    // fp8: {bn, bk}, or empty (per-tensor / per-channel scales)
  std::vector<std::string> modules_to_not_convert;  // kept unquantized (matched as substrings of module names)
  // gptq: the lm_head is a quantized Linear like the decoder's ("lm_head":
  // true, as GPTQModel writes it; lm_head.{qweight,qzeros,scales,g_idx}).
  // AutoAWQ and FP8 checkpoints never quantize it.
  bool lm_head = false;
  // Not a config field: the dtype the checkpoint stores scales (awq/gptq) or
  // weight_scale_inv (fp8) in. F16 for AutoAWQ/AutoGPTQ, BF16 for Qwen's FP8;
  // plan sets it from the safetensors headers, make-model writes it.
  DType scales_dtype = DType::kF16;

  bool enabled() const { return method != QuantMethod::kNone; }
  // Whether a Linear module ("model.layers.0.self_attn.q_proj") is stored
  // quantized; "lm_head" only when `lm_head` is set, embed_tokens never.
  bool quantizes(const std::string& module) const;
  // Elements packed per int32 word (awq/gptq): 32 / bits.
  int pack_factor() const { return bits > 0 ? 32 / bits : 0; }
  // Groups along the input dimension of a [N, K] Linear (awq/gptq).
  int64_t n_groups(int64_t in_features) const;
  // Input rows per group (awq/gptq): group_size, or in_features for -1.
  int64_t group_rows(int64_t in_features) const;
  // "awq 4-bit group 128", "gptq 8-bit group 128 sym desc_act", "fp8 e4m3 block [128, 128]"
  std::string describe() const;
};

// Parses a quantization_config object. `source` names it in messages
// ("config.json quantization_config"). `separate_file`: read from
// quantize_config.json, where quant_method may be absent (older AutoGPTQ
// writes none: it means gptq). Throws Error(kUnsupported) naming the field,
// the value found and the values supported; Error(kInvalidArgument) for a
// field of the wrong type.
QuantConfig parse_quantization_config(const nlohmann::json& config, const std::string& source, bool separate_file);

// The quantization_config of a named format as the published checkpoints
// use it: "awq" (4-bit, zero points, GEMM), "gptq" (4-bit), "gptq-int8",
// "fp8" (E4M3, blocks [128, 128], lm_head unconverted). `option` names the
// flag in messages ("--quantize"). Throws Error(kInvalidArgument) for another
// name or a group size the format does not take.
QuantConfig published_quant_config(const std::string& format, int64_t group_size, bool desc_act, bool sym,
                                   const std::string& option);

// Sets quant.lm_head: the lm_head is quantized too (`option` names the flag
// in messages, "--lm-head"). Throws Error(kInvalidArgument) for AWQ and FP8,
// whose published checkpoints keep lm_head in the checkpoint dtype.
void enable_quantized_lm_head(QuantConfig& quant, const std::string& option);

// The quantization_config object as the published checkpoints carry it
// (what make-model writes into config.json).
nlohmann::json quantization_config_json(const QuantConfig& quant);

}  // namespace shardlm
