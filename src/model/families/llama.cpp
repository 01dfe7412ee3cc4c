// Llama 3.x and Mistral: the pre-norm decoder layer
//   h = x + o_proj(attn(rope(q), rope(k), v)),  q, k, v = proj(rms_norm(x))
//   out = h + down(silu(gate(n)) × up(n)),      n = rms_norm(h)
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) { check_attention_shape(spec, "llama", false, false); }

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));
  rope_and_cache(c, w, cache, a);
  residual_add(c, hidden, attend_and_project(c, w, cache, a), "ffn_inp", w.layer);
  residual_add(c, hidden, gated_mlp(c, w, norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer)), "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kLlamaGraph{"llama", check, layer};

}  // namespace shardlm
