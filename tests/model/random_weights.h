// Synthetic checkpoints in memory for model tests: every tensor
// expected_tensors(spec) lists, random normal values in spec.dtype.
#pragma once

#include <memory>

#include "loader/model_spec.h"
#include "model/weight_source.h"

namespace shardlm::testing {

std::shared_ptr<MemoryWeightSource> random_weights(const ModelSpec& spec, uint32_t seed);

// A Qwen2.5-7B-shaped spec (28 Q heads, 4 KV heads, head_dim 128) with the
// given hidden size (3584 is the real one), layers, MLP width and vocabulary.
ModelSpec qwen25_7b_like(int64_t hidden, int64_t n_layers, int64_t intermediate, int64_t vocab);

}  // namespace shardlm::testing
