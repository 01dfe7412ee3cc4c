// Qwen3: the Llama layer with RMSNorm over each head of q and k after the
// projections and before RoPE.
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) { check_attention_shape(spec, "qwen3", false, true); }

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));
  qk_norm(c, w, a);
  rope_and_cache(c, w, cache, a);
  residual_add(c, hidden, attend_and_project(c, w, cache, a), "ffn_inp", w.layer);
  residual_add(c, hidden, gated_mlp(c, w, norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer)), "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kQwen3Graph{"qwen3", check, layer};

}  // namespace shardlm
