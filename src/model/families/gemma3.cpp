// Gemma 3: norms on both sides of attention and of the MLP ("sandwich"),
// per-head q/k norms, GeGLU, and local layers with a sliding window and
// their own rope table (the weights' attention_window and local_rope).
//   h   = x + post_attn_norm(o_proj(attn(rope(q_norm(q)), rope(k_norm(k)), v)))
//   out = h + post_mlp_norm(down(gelu_tanh(gate(n)) × up(n))),  n = pre_ffn_norm(h)
// Every norm multiplies by (1 + w) (dims.norm_offset = 1).
#include "core/error.h"
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) {
  check_attention_shape(spec, "gemma3", false, true);
  if (spec.norm_weight_offset != 1.0f || !spec.scale_embeddings || spec.mlp_activation != MlpActivation::kGeluTanh)
    fail(ErrorCode::kUnsupported, spec.architecture,
         ": the gemma3 graph needs (1 + w) norms, scaled embeddings and a gelu_tanh MLP, as the gemma3 family parses");
}

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));
  qk_norm(c, w, a);
  rope_and_cache(c, w, cache, a);
  Tensor attn = attend_and_project(c, w, cache, a);
  norm_in_place(c, attn, w.post_attn_norm, "attn_post_norm", w.layer);
  residual_add(c, hidden, attn, "ffn_inp", w.layer);
  Tensor mlp = gated_mlp(c, w, norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer));
  norm_in_place(c, mlp, w.post_mlp_norm, "ffn_post_norm", w.layer);
  residual_add(c, hidden, mlp, "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kGemma3Graph{"gemma3", check, layer};

}  // namespace shardlm
