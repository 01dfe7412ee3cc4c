// Qwen2 / Qwen2.5: the Llama layer with biases on q, k and v (they live in
// the q/k/v Linears, which add them).
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) { check_attention_shape(spec, "qwen2", true, false); }

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));  // + biases
  rope_and_cache(c, w, cache, a);
  residual_add(c, hidden, attend_and_project(c, w, cache, a), "ffn_inp", w.layer);
  residual_add(c, hidden, gated_mlp(c, w, norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer)), "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kQwen2Graph{"qwen2", check, layer};

}  // namespace shardlm
