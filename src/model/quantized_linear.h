// A rank's quantized Linear from the parts plan's rank_tensors gave it: the
// stored tensors (views of the mapping or column-slice copies, in their
// checkpoint dtypes) put together as a backend::QuantizedWeight, after
// checking each part's dtype and the g_idx values against the config.
#pragma once

#include <map>
#include <string>

#include "backend/backend.h"
#include "loader/model_spec.h"
#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

// One tensor as this rank holds it, with the slice plan chose for it.
struct HeldTensor {
  Tensor tensor;
  TensorShard shard;
};

// The backend scheme and bit width of a quantization_config.
backend::WeightScheme weight_scheme(const QuantConfig& quant);

// The Linear `module` ("model.layers.0.mlp.down_proj") of this rank. For a
// module the config quantizes, its parts must be in `held`; unquantized
// modules read "<module>.weight". Throws Error(kInvalidArgument) naming the
// tensor when a g_idx value points outside the groups the rank holds.
backend::Linear assemble_linear(const ModelSpec& spec, const std::string& module,
                                const std::map<std::string, HeldTensor>& held, const std::string& source);

// Throws Error(kUnsupported) naming the tensor, the dtype found and those the
// quantization stores when a quantized part (or an unquantized tensor of a
// quantized checkpoint) has another dtype. `spec_tensor` is the tensor's entry
// of expected_tensors.
void check_part_dtype(const ModelSpec& spec, const TensorSpec& spec_tensor, DType found, const std::string& source);

// Sets spec.quant.scales_dtype to the dtype the checkpoint stores its first
// scales (awq/gptq) or weight_scale_inv (fp8) tensor in, so that budgets
// count the bytes this checkpoint holds (plan does the same from the headers).
void adopt_checkpoint_scales_dtype(ModelSpec& spec, const WeightSource& weights);

}  // namespace shardlm
