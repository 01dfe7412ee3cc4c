#include "model/layers.h"

#include <cstring>

#include "core/error.h"

namespace shardlm {

namespace {
float* grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}
}  // namespace

void attention_block(const RankDims& d, const DecoderLayerWeights& w, const float* inv_freq,
                     const backend::KvLayerView& cache, const StepTokens& step, float* hidden, Communicator& tp,
                     Scratch& s) {
  const int64_t n = step.n_tokens, hd = d.head_dim;
  float* x = grow(s.normed, n * d.hidden);                  // [n, hidden]
  float* q = grow(s.q, n * d.n_q_local * hd);               // [n, n_q_local, head_dim]
  float* k = grow(s.k, n * d.n_kv_local * hd);              // [n, n_kv_local, head_dim]
  float* v = grow(s.v, n * d.n_kv_local * hd);              // [n, n_kv_local, head_dim]
  float* attn = grow(s.attn, n * d.n_q_local * hd);         // [n, n_q_local, head_dim]
  float* proj = grow(s.proj, n * d.hidden);                 // [n, hidden] partial sum of this rank
  backend::rms_norm(hidden, n, w.input_norm, d.eps, x);
  backend::matmul(x, n, w.q.w, w.q.bias(), q);
  backend::matmul(x, n, w.k.w, w.k.bias(), k);
  backend::matmul(x, n, w.v.w, w.v.bias(), v);
  if (w.q_norm.data) {
    backend::rms_norm(q, n * d.n_q_local, w.q_norm, d.eps, q);
    backend::rms_norm(k, n * d.n_kv_local, w.k_norm, d.eps, k);
  }
  backend::rope(q, n, d.n_q_local, hd, step.positions, inv_freq);
  backend::rope(k, n, d.n_kv_local, hd, step.positions, inv_freq);
  backend::kv_cache_write(cache, step.seqs, step.n_seqs, k, v);
  backend::paged_attention(q, cache, step.seqs, step.n_seqs, d.heads, attn);
  backend::matmul(attn, n, w.o.w, w.o.bias(), proj);
  tp.all_reduce_sum(proj, static_cast<size_t>(n * d.hidden));
  backend::add_inplace(hidden, proj, n * d.hidden);
}

void mlp_block(const RankDims& d, const DecoderLayerWeights& w, const StepTokens& step, float* hidden,
               Communicator& tp, Scratch& s) {
  const int64_t n = step.n_tokens;
  float* x = grow(s.normed, n * d.hidden);            // [n, hidden]
  float* gate = grow(s.gate, n * d.inter_local);      // [n, inter_local]
  float* up = grow(s.up, n * d.inter_local);          // [n, inter_local]
  float* proj = grow(s.proj, n * d.hidden);           // [n, hidden]
  backend::rms_norm(hidden, n, w.post_norm, d.eps, x);
  backend::matmul(x, n, w.gate.w, w.gate.bias(), gate);
  backend::matmul(x, n, w.up.w, w.up.bias(), up);
  backend::silu_mul(gate, up, n * d.inter_local, gate);
  backend::matmul(gate, n, w.down.w, w.down.bias(), proj);
  tp.all_reduce_sum(proj, static_cast<size_t>(n * d.hidden));
  backend::add_inplace(hidden, proj, n * d.hidden);
}

void embed_tokens(const backend::MatrixView& emb, Range vocab, int64_t vocab_size, const int32_t* ids, int64_t n,
                  float* out, Communicator& tp) {
  const int64_t h = emb.cols;
  const size_t esize = dtype_size(emb.dtype);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = ids[t];
    if (id < 0 || id >= vocab_size)
      fail(ErrorCode::kInvalidArgument, "token id ", id, " at position ", t, " is outside the vocabulary [0, ",
           vocab_size, ")");
    float* row = out + t * h;
    if (!vocab.contains(id)) {
      std::memset(row, 0, static_cast<size_t>(h) * sizeof(float));
      continue;
    }
    const void* src = static_cast<const char*>(emb.data) + static_cast<size_t>((id - vocab.begin) * h) * esize;
    for (int64_t i = 0; i < h; ++i) row[i] = load_as_f32(src, emb.dtype, static_cast<size_t>(i));
  }
  if (tp.size() > 1) tp.all_reduce_sum(out, static_cast<size_t>(n * h));
}

void lm_head_logits(const float* x, int64_t n, const backend::MatrixView& head, const std::vector<Range>& vocab_ranges,
                    float* logits, Communicator& tp) {
  const int n_ranks = static_cast<int>(vocab_ranges.size());
  const int64_t vocab_size = vocab_ranges.back().end;
  SHARDLM_CHECK(n_ranks == tp.size() && head.rows == vocab_ranges[tp.rank()].size());
  if (n_ranks == 1) {
    backend::matmul(x, n, head, nullptr, logits);
    return;
  }
  std::vector<float> local(static_cast<size_t>(n * head.rows));  // [n, vocab_local]
  backend::matmul(x, n, head, nullptr, local.data());
  std::vector<size_t> counts(n_ranks);
  for (int r = 0; r < n_ranks; ++r) counts[r] = static_cast<size_t>(n * vocab_ranges[r].size());
  std::vector<float> gathered(static_cast<size_t>(n * vocab_size));  // per rank r: [n, vocab_r]
  tp.all_gather(local.data(), gathered.data(), counts);
  size_t offset = 0;
  for (int r = 0; r < n_ranks; ++r) {
    const Range vr = vocab_ranges[r];
    for (int64_t t = 0; t < n; ++t)
      std::memcpy(logits + t * vocab_size + vr.begin, gathered.data() + offset + t * vr.size(),
                  static_cast<size_t>(vr.size()) * sizeof(float));
    offset += counts[r];
  }
}

}  // namespace shardlm
