#include "model/moe_block.h"

#include "core/error.h"

namespace shardlm {

void moe_block(backend::Backend& b, const RankDims& d, const DecoderLayerWeights& w, const StepContext& step,
               Tensor& hidden, Communicator& tp, Workspace& ws, std::vector<int32_t>* trace) {
  SHARDLM_CHECK(w.sparse() && d.n_experts > 0 && d.top_k > 0, "moe_block on a dense layer ", w.layer);
  const int64_t n = step.meta.n_tokens();
  Tensor x = ws.normed(n), logits = ws.router_logits(n), ids = ws.route_ids(n), weights = ws.route_weights(n);
  Tensor proj = ws.proj(n);
  b.rms_norm(hidden, w.post_norm, d.eps, x);
  b.matmul(x, w.router, logits);
  b.moe_route(logits, d.top_k, d.renormalize, ids, weights);
  if (trace) {
    const size_t at = trace->size();
    trace->resize(at + static_cast<size_t>(ids.numel()));
    b.download(ids, trace->data() + at);
  }
  b.moe_experts(x, ids, weights, w.experts.data(), static_cast<int64_t>(w.experts.size()), w.expert_begin, proj);
  tp.all_reduce_sum(proj);
  b.add(hidden, proj);
}

}  // namespace shardlm
