// Every family's graph: one line each.
#include "core/error.h"
#include "model/families/family.h"

namespace shardlm {

extern const DecoderFamily kQwen2Graph, kQwen3Graph, kLlamaGraph, kMixtralGraph, kQwen3MoeGraph, kPhi3Graph,
    kGemma3Graph;

const DecoderFamily& decoder_family(const ModelSpec& spec) {
  const DecoderFamily* f = nullptr;
  switch (spec.family) {
    case Family::kQwen2: f = &kQwen2Graph; break;
    case Family::kQwen3: f = &kQwen3Graph; break;
    case Family::kLlama:
    case Family::kMistral: f = &kLlamaGraph; break;
    case Family::kMixtral: f = &kMixtralGraph; break;
    case Family::kQwen3Moe: f = &kQwen3MoeGraph; break;
    case Family::kPhi3: f = &kPhi3Graph; break;
    case Family::kGemma3: f = &kGemma3Graph; break;
  }
  if (!f) fail(ErrorCode::kUnsupported, "architecture ", spec.architecture, " has no model graph");
  f->check(spec);
  return *f;
}

void check_attention_shape(const ModelSpec& spec, const char* family, bool bias, bool qk_norm) {
  if (spec.qkv_bias != bias)
    fail(ErrorCode::kUnsupported, spec.architecture, ": the ", family, " graph has ", bias ? "" : "no ",
         "q/k/v biases, but the model spec says qkv_bias=", spec.qkv_bias ? "true" : "false");
  if (spec.qk_norm != qk_norm)
    fail(ErrorCode::kUnsupported, spec.architecture, ": the ", family, " graph has ", qk_norm ? "" : "no ",
         "per-head q/k norms, but the model spec says qk_norm=", spec.qk_norm ? "true" : "false");
}

}  // namespace shardlm
