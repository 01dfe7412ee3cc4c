#include "model/layers.h"

#include "core/error.h"

namespace shardlm {

void Workspace::reserve(backend::Backend& b, const RankDims& d, int64_t n_tokens) {
  if (n_tokens <= capacity_) return;
  const DType a = b.activation_dtype();
  const int64_t n = n_tokens, hd = d.head_dim;
  normed_ = b.alloc(a, {n, d.hidden});
  q_ = b.alloc(a, {n, d.n_q_local, hd});
  k_ = b.alloc(a, {n, d.n_kv_local, hd});
  v_ = b.alloc(a, {n, d.n_kv_local, hd});
  attn_ = b.alloc(a, {n, d.n_q_local * hd});
  proj_ = b.alloc(a, {n, d.hidden});
  gate_ = b.alloc(a, {n, d.inter_local});
  up_ = b.alloc(a, {n, d.inter_local});
  if (d.n_experts > 0) {
    router_logits_ = b.alloc(a, {n, d.n_experts});
    route_ids_ = b.alloc(DType::kI32, {n, d.top_k});
    route_weights_ = b.alloc(DType::kF32, {n, d.top_k});
  }
  capacity_ = n_tokens;
}

void attention_block(backend::Backend& b, const RankDims& d, const DecoderLayerWeights& w,
                     const backend::KvLayerView& cache, const StepContext& step, Tensor& hidden, Communicator& tp,
                     Workspace& ws) {
  const int64_t n = step.meta.n_tokens(), hd = d.head_dim;
  Tensor x = ws.normed(n), q = ws.q(n), k = ws.k(n), v = ws.v(n), attn = ws.attn(n), proj = ws.proj(n);
  b.rms_norm(hidden, w.input_norm, d.eps, x);
  b.matmul(x, w.q, q);
  b.matmul(x, w.k, k);
  b.matmul(x, w.v, v);
  if (w.q_norm.defined()) {
    Tensor q_heads = q.reshape({n * d.n_q_local, hd}), k_heads = k.reshape({n * d.n_kv_local, hd});
    b.rms_norm(q_heads, w.q_norm, d.eps, q_heads);
    b.rms_norm(k_heads, w.k_norm, d.eps, k_heads);
  }
  b.rope(q, step.inv_freq, step.meta);
  b.rope(k, step.inv_freq, step.meta);
  b.kv_cache_write(cache, step.meta, k, v);
  b.paged_attention(q, cache, step.meta, d.heads, attn);
  b.matmul(attn, w.o, proj);
  tp.all_reduce_sum(proj);
  b.add(hidden, proj);
}

void mlp_block(backend::Backend& b, const RankDims& d, const DecoderLayerWeights& w, const StepContext& step,
               Tensor& hidden, Communicator& tp, Workspace& ws) {
  const int64_t n = step.meta.n_tokens();
  Tensor x = ws.normed(n), gate = ws.gate(n), up = ws.up(n), proj = ws.proj(n);
  b.rms_norm(hidden, w.post_norm, d.eps, x);
  b.matmul(x, w.gate, gate);
  b.matmul(x, w.up, up);
  b.silu_mul(gate, up, gate);
  b.matmul(gate, w.down, proj);
  tp.all_reduce_sum(proj);
  b.add(hidden, proj);
}

void embed_tokens(backend::Backend& b, const Tensor& emb, Range vocab, int64_t vocab_size,
                  const backend::StepMetadata& meta, Tensor& out, Communicator& tp) {
  b.embed(emb, vocab.begin, vocab.end, vocab_size, meta, out);
  if (tp.size() > 1) tp.all_reduce_sum(out);
}

void lm_head_logits(backend::Backend& b, const Tensor& x, const Linear& head, const std::vector<Range>& vocab_ranges,
                    Tensor& logits, Tensor& local, Tensor& gathered, Communicator& tp) {
  const int n_ranks = static_cast<int>(vocab_ranges.size());
  const int64_t n = x.dim(0);
  SHARDLM_CHECK(n_ranks == tp.size() && head.weight.dim(0) == vocab_ranges[tp.rank()].size() &&
                logits.rank() == 2 && logits.dim(1) == vocab_ranges.back().end);
  if (n_ranks == 1) {
    b.matmul(x, head, logits);
    return;
  }
  b.matmul(x, head, local);  // [n, vocab_local]
  std::vector<size_t> counts(n_ranks);
  for (int r = 0; r < n_ranks; ++r) counts[r] = static_cast<size_t>(n * vocab_ranges[r].size());
  tp.all_gather(local.data(), gathered.data(), counts, local.dtype());  // per rank r: [n, vocab_r]
  // Rank-major slices → [n, vocab_size] rows, on the backend's device.
  const Tensor flat = gathered.reshape({gathered.numel()});
  int64_t offset = 0;
  for (int r = 0; r < n_ranks; ++r) {
    const Range vr = vocab_ranges[r];
    const int64_t count = n * vr.size();
    b.copy_columns(flat.slice_rows(offset, offset + count).reshape({n, vr.size()}), logits, vr.begin);
    offset += count;
  }
}

}  // namespace shardlm
