// Mixtral: the Mistral attention and, on every layer, the sparse MLP (the
// softmax over the chosen experts' logits: dims.renormalize).
#include "core/error.h"
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) {
  check_attention_shape(spec, "mixtral", false, false);
  if (!spec.is_moe() || spec.n_moe_layers() != spec.n_layers)
    fail(ErrorCode::kUnsupported, spec.architecture, ": the mixtral graph has experts on every layer");
}

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));
  rope_and_cache(c, w, cache, a);
  residual_add(c, hidden, attend_and_project(c, w, cache, a), "ffn_inp", w.layer);
  residual_add(c, hidden, moe(c, w, norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer)), "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kMixtralGraph{"mixtral", check, layer};

}  // namespace shardlm
