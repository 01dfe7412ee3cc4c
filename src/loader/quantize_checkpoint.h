// Quantizes an existing unquantized checkpoint (`shardlm quantize`) into a
// published layout by round-to-nearest (loader/quant_pack.h): every decoder
// Linear the config quantizes becomes its AWQ / GPTQ / FP8 parts; embeddings,
// norms, biases and lm_head are copied as they are (their dtype kept), except
// that GPTQ with quant.lm_head quantizes lm_head too (a tied model is written
// untied: lm_head from the embedding table, tie_word_embeddings false);
// config.json gains the quantization_config; the tokenizer and generation
// files are copied. For measuring what a format costs in accuracy on a real
// (trained) model, not a calibrated quantizer (no AWQ scaling search, no
// GPTQ error feedback).
#pragma once

#include <cstdint>
#include <filesystem>

#include "loader/model_spec.h"

namespace shardlm {

struct QuantizeCheckpointResult {
  ModelSpec spec;            // the written config
  int64_t n_quantized = 0;   // Linear modules quantized
  uint64_t total_size = 0;   // tensor bytes written
};

// Throws Error(kInvalidArgument) when src is already quantized, dst is src,
// or the shapes do not fit the quantization (naming the tensor and field);
// Error(kNotFound) / kCorruptFile from opening src.
QuantizeCheckpointResult quantize_checkpoint(const std::filesystem::path& src, const std::filesystem::path& dst,
                                             const QuantConfig& quant);

}  // namespace shardlm
