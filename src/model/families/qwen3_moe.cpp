// Qwen3-MoE: the Qwen3 attention; the sparse MLP on the layers the config
// makes sparse (decoder_sparse_step, mlp_only_layers), the dense one elsewhere.
#include "core/error.h"
#include "model/families/family.h"

namespace shardlm {

namespace {

void check(const ModelSpec& spec) {
  check_attention_shape(spec, "qwen3_moe", false, true);
  if (!spec.is_moe()) fail(ErrorCode::kUnsupported, spec.architecture, ": the qwen3_moe graph needs experts (num_experts)");
}

void layer(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache, Tensor& hidden) {
  const Qkv a = qkv(c, w, norm(c, hidden, w.attn_norm, "attn_norm", w.layer));
  qk_norm(c, w, a);
  rope_and_cache(c, w, cache, a);
  residual_add(c, hidden, attend_and_project(c, w, cache, a), "ffn_inp", w.layer);
  const Tensor x = norm(c, hidden, w.mlp_norm, "ffn_norm", w.layer);
  residual_add(c, hidden, w.sparse() ? moe(c, w, x) : gated_mlp(c, w, x), "l_out", w.layer);
}

}  // namespace

extern const DecoderFamily kQwen3MoeGraph{"qwen3_moe", check, layer};

}  // namespace shardlm
