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

Tensor norm(const LayerContext& c, const Tensor& hidden, const Tensor& weight, std::string_view name, int64_t layer) {
  Tensor x = c.ws.normed(c.n_tokens());  // [n, hidden]
  c.b.rms_norm(hidden, {weight, c.dims.norm_offset}, c.dims.eps, x);
  c.name(name, layer, x);
  return x;
}

void norm_in_place(const LayerContext& c, Tensor& x, const Tensor& weight, std::string_view name, int64_t layer) {
  c.b.rms_norm(x, {weight, c.dims.norm_offset}, c.dims.eps, x);
  c.name(name, layer, x);
}

Qkv qkv(const LayerContext& c, const DecoderLayerWeights& w, const Tensor& x) {
  const int64_t n = c.n_tokens();
  Qkv a{c.ws.q(n), c.ws.k(n), c.ws.v(n)};
  // One call for the three products of x (the CPU runs their row blocks in one parallel region).
  const backend::MatmulOut outs[] = {{&w.q, &a.q}, {&w.k, &a.k}, {&w.v, &a.v}};
  c.b.matmul_many(x, outs);
  c.name("q", w.layer, a.q);
  c.name("k", w.layer, a.k);
  c.name("v", w.layer, a.v);
  return a;
}

void qk_norm(const LayerContext& c, const DecoderLayerWeights& w, const Qkv& a) {
  const RankDims& d = c.dims;
  const int64_t n = c.n_tokens();
  Tensor q_heads = a.q.reshape({n * d.n_q_local, d.head_dim}), k_heads = a.k.reshape({n * d.n_kv_local, d.head_dim});
  c.b.rms_norm(q_heads, {w.q_norm, d.norm_offset}, d.eps, q_heads);
  c.b.rms_norm(k_heads, {w.k_norm, d.norm_offset}, d.eps, k_heads);
  c.name("q_norm", w.layer, a.q);
  c.name("k_norm", w.layer, a.k);
}

void rope_and_cache(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache,
                    const Qkv& a) {
  const int64_t layer = w.layer;
  const Tensor& inv_freq = w.local_rope ? c.step.inv_freq_local : c.step.inv_freq;
  SHARDLM_CHECK(inv_freq.defined(), "layer ", layer, ": no local rope table");
  Tensor q = a.q, k = a.k;
  const float mscale = w.local_rope ? 1.0f : c.dims.rope_mscale;
  c.b.rope(q, inv_freq, c.step.meta, mscale);
  c.b.rope(k, inv_freq, c.step.meta, mscale);
  c.name("q_rope", layer, q);
  c.name("k_rope", layer, k);
  c.b.kv_cache_write(cache, c.step.meta, k, a.v);
}

Tensor attend_and_project(const LayerContext& c, const DecoderLayerWeights& w, const backend::KvLayerView& cache,
                          const Qkv& a) {
  const int64_t n = c.n_tokens();
  Tensor attn = c.ws.attn(n), proj = c.ws.proj(n);
  backend::AttentionHeads heads = c.dims.heads;
  heads.window = w.attention_window;
  c.b.paged_attention(a.q, cache, c.step.meta, heads, attn);
  c.name("kqv", w.layer, attn);
  c.b.matmul(attn, w.o, proj);
  c.tp.all_reduce_sum(proj);
  c.name("attn_out", w.layer, proj);
  return proj;
}

Tensor gated_mlp(const LayerContext& c, const DecoderLayerWeights& w, const Tensor& x) {
  const int64_t n = c.n_tokens();
  Tensor gate = c.ws.gate(n), up = c.ws.up(n), proj = c.ws.proj(n);
  const backend::MatmulOut outs[] = {{&w.gate, &gate}, {&w.up, &up}};  // one call, as qkv's
  c.b.matmul_many(x, outs);
  c.name("ffn_gate", w.layer, gate);
  c.name("ffn_up", w.layer, up);
  if (c.dims.activation == MlpActivation::kGeluTanh) {
    c.b.gelu_tanh_mul(gate, up, gate);
  } else {
    c.b.silu_mul(gate, up, gate);
  }
  c.name("ffn_act", w.layer, gate);
  c.b.matmul(gate, w.down, proj);
  c.tp.all_reduce_sum(proj);
  c.name("ffn_out", w.layer, proj);
  return proj;
}

Tensor moe(const LayerContext& c, const DecoderLayerWeights& w, const Tensor& x) {
  const RankDims& d = c.dims;
  SHARDLM_CHECK(w.sparse() && d.n_experts > 0 && d.top_k > 0, "moe on a dense layer ", w.layer);
  const int64_t n = c.n_tokens();
  Tensor logits = c.ws.router_logits(n), ids = c.ws.route_ids(n), weights = c.ws.route_weights(n);
  Tensor proj = c.ws.proj(n);
  c.b.matmul(x, w.router, logits);
  c.name("ffn_moe_logits", w.layer, logits);
  c.b.moe_route(logits, d.top_k, d.renormalize, ids, weights);
  c.name("ffn_moe_topk", w.layer, ids);
  c.name("ffn_moe_weights", w.layer, weights);
  c.b.moe_experts(x, ids, weights, w.experts.data(), static_cast<int64_t>(w.experts.size()), w.expert_begin, proj);
  c.tp.all_reduce_sum(proj);
  c.name("ffn_out", w.layer, proj);
  return proj;
}

void residual_add(const LayerContext& c, Tensor& hidden, const Tensor& delta, std::string_view name, int64_t layer) {
  c.b.add(hidden, delta);
  c.name(name, layer, hidden);
}

backend::RopeConfig rope_config(const ModelSpec& spec) {
  backend::RopeConfig rc;
  rc.head_dim = spec.rotary_dim();
  rc.theta = spec.rope_theta;
  const RopeScaling& s = spec.rope_scaling;
  if (s.type.empty() || s.type == "default") {
    rc.scaling = backend::RopeConfig::Scaling::kNone;
  } else if (s.type == "linear") {
    rc.scaling = backend::RopeConfig::Scaling::kLinear;
    rc.factor = s.factor;
  } else if (s.type == "longrope") {
    rc.scaling = backend::RopeConfig::Scaling::kLongRope;
    rc.ext_factors = s.short_factor;  // CausalLM builds the long factors' table beside it
  } else if (s.type == "llama3") {
    rc.scaling = backend::RopeConfig::Scaling::kLlama3;
    rc.factor = s.factor;
    rc.low_freq_factor = s.low_freq_factor;
    rc.high_freq_factor = s.high_freq_factor;
    rc.original_max_position = s.original_max_position_embeddings;
    if (!(s.high_freq_factor > s.low_freq_factor))
      fail(ErrorCode::kInvalidArgument, "config.json rope_scaling: high_freq_factor (", s.high_freq_factor,
           ") must exceed low_freq_factor (", s.low_freq_factor, ")");
  } else {
    fail(ErrorCode::kUnsupported, "config.json rope_scaling.rope_type \"", s.type,
         "\" is not supported by the CPU engine (supported: none, linear, llama3, longrope)");
  }
  if (rc.head_dim % 2 != 0 || rc.head_dim < 2 || rc.head_dim > spec.head_dim)
    fail(ErrorCode::kUnsupported, "rotary dims ", rc.head_dim, " of head_dim ", spec.head_dim,
         ": rotary embeddings need an even count of at most head_dim");
  if (rc.scaling == backend::RopeConfig::Scaling::kLongRope && static_cast<int64_t>(rc.ext_factors.size()) != rc.head_dim / 2)
    fail(ErrorCode::kInvalidArgument, "rope_scaling.short_factor has ", rc.ext_factors.size(), " entries for ",
         rc.head_dim / 2, " rotary frequencies");
  return rc;
}

backend::RopeConfig local_rope_config(const ModelSpec& spec) {
  backend::RopeConfig rc;
  rc.head_dim = spec.head_dim;
  rc.theta = spec.rope_local_theta;
  return rc;
}

void embed_tokens(backend::Backend& b, const Tensor& emb, Range vocab, int64_t vocab_size,
                  const backend::StepMetadata& meta, Tensor& out, Communicator& tp, float scale) {
  b.embed(emb, vocab.begin, vocab.end, vocab_size, meta, out);
  if (tp.size() > 1) tp.all_reduce_sum(out);
  if (scale != 1.0f) b.scale(out, scale);
}

void lm_head_logits(backend::Backend& b, const Tensor& x, const Linear& head, const std::vector<Range>& vocab_ranges,
                    Tensor& logits, Tensor& local, Tensor& gathered, Communicator& tp) {
  const int n_ranks = static_cast<int>(vocab_ranges.size());
  const int64_t n = x.dim(0);
  SHARDLM_CHECK(n_ranks == tp.size() && head.out_features() == vocab_ranges[tp.rank()].size() &&
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
