#include "model/family.h"

#include "core/error.h"

namespace shardlm {

backend::RopeConfig rope_config(const ModelSpec& spec) {
  backend::RopeConfig rc;
  rc.head_dim = spec.head_dim;
  rc.theta = spec.rope_theta;
  const RopeScaling& s = spec.rope_scaling;
  if (s.type.empty() || s.type == "default") {
    rc.scaling = backend::RopeConfig::Scaling::kNone;
  } else if (s.type == "linear") {
    rc.scaling = backend::RopeConfig::Scaling::kLinear;
    rc.factor = s.factor;
  } else if (s.type == "llama3") {
    rc.scaling = backend::RopeConfig::Scaling::kLlama3;
    rc.factor = s.factor;
    rc.low_freq_factor = s.low_freq_factor;
    rc.high_freq_factor = s.high_freq_factor;
    rc.original_max_position = s.original_max_position_embeddings;
    if (!(s.high_freq_factor > s.low_freq_factor))
      fail(ErrorCode::kInvalidArgument, "config.json rope_scaling: high_freq_factor (", s.high_freq_factor,
           ") must exceed low_freq_factor (", s.low_freq_factor, ")");
  } else {
    fail(ErrorCode::kUnsupported, "config.json rope_scaling.rope_type \"", s.type,
         "\" is not supported by the CPU engine (supported: none, linear, llama3)");
  }
  if (spec.head_dim % 2 != 0)
    fail(ErrorCode::kUnsupported, "head_dim ", spec.head_dim, " is odd; rotary embeddings need an even head_dim");
  return rc;
}

FamilyGraph family_graph(const ModelSpec& spec) {
  switch (spec.family) {
    case Family::kQwen2: return qwen2_graph(spec);
    case Family::kQwen3: return qwen3_graph(spec);
    case Family::kLlama:
    case Family::kMistral: return llama_graph(spec);
    case Family::kQwen3Moe: return qwen3_moe_graph(spec);
    case Family::kMixtral: return mixtral_graph(spec);
    default: break;
  }
  fail(ErrorCode::kUnsupported, "architecture ", spec.architecture, " has no CPU model graph");
}

}  // namespace shardlm
