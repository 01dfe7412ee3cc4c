// Phi-3 / Phi-4: the Llama layer. Its fused qkv_proj and gate_up_proj reach
// the graph as separate q, k, v, gate and up Linears: each part's rows of the
// rank (plan's fused-part slices) are a contiguous view of the fused tensor.
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) { check_attention_shape(spec, "phi3", false, false); }

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));
  rope_and_cache(c, w, cache, a);
  residual_add(c, hidden, attend_and_project(c, w, cache, a), "ffn_inp", w.layer);
  residual_add(c, hidden, gated_mlp(c, w, norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer)), "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kPhi3Graph{"phi3", check, layer};

}  // namespace shardlm
