#include "model/causal_lm.h"

#include <cstring>
#include <map>

#include "core/error.h"

namespace shardlm {

RankComms split_rank_comms(Communicator& world, const Layout& layout) {
  const int tp = layout.tp, rank = world.rank();
  SHARDLM_CHECK(world.size() == layout.tp * layout.pp, "world of ", world.size(), " ranks for ", layout.to_string());
  RankComms c;
  c.tp = world.split(rank / tp, rank % tp);  // same stage
  c.pp = world.split(rank % tp, rank / tp);  // same tp rank
  return c;
}

CausalLM::CausalLM(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank, Communicator& tp,
                   Communicator& pp)
    : spec_(spec), layout_(layout), shard_(shard_for(spec, layout, tp_rank, pp_rank)), graph_(family_graph(spec)),
      tp_(tp), pp_(pp) {
  if (tp.size() != layout.tp || tp.rank() != tp_rank)
    fail(ErrorCode::kInternal, "tensor-parallel communicator has rank ", tp.rank(), " of ", tp.size(),
         ", expected rank ", tp_rank, " of ", layout.tp);
  if (pp.size() != layout.pp || pp.rank() != pp_rank)
    fail(ErrorCode::kInternal, "pipeline communicator has rank ", pp.rank(), " of ", pp.size(), ", expected rank ",
         pp_rank, " of ", layout.pp);
  dims_.hidden = spec.hidden_size;
  dims_.head_dim = spec.head_dim;
  dims_.n_q_local = shard_.q_heads.size();
  dims_.n_kv_local = shard_.kv_heads.size();
  dims_.inter_local = shard_.intermediate.size();
  dims_.eps = static_cast<float>(spec.rms_norm_eps);
  dims_.heads = {shard_.q_heads.size(), shard_.q_heads.begin, shard_.kv_heads.begin, spec.group_size()};
  inv_freq_.resize(static_cast<size_t>(spec.head_dim / 2));
  backend::rope_inv_freq(graph_.rope, inv_freq_.data());
  for (int r = 0; r < layout.tp; ++r) vocab_ranges_.push_back(shard_for(spec, layout, r, pp_rank).vocab);
}

std::unique_ptr<CausalLM> CausalLM::load(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                         const Layout& layout, int tp_rank, int pp_rank, Communicator& tp,
                                         Communicator& pp) {
  std::unique_ptr<CausalLM> m(new CausalLM(spec, layout, tp_rank, pp_rank, tp, pp));
  m->load_weights(std::move(weights));
  return m;
}

std::unique_ptr<CausalLM> CausalLM::load_dir(const std::filesystem::path& model_dir, const Layout& layout,
                                             int tp_rank, int pp_rank, Communicator& tp, Communicator& pp) {
  ModelSpec spec = load_model_config(model_dir / "config.json");
  return load(spec, open_checkpoint(model_dir), layout, tp_rank, pp_rank, tp, pp);
}

void CausalLM::load_weights(std::shared_ptr<const WeightSource> weights) {
  weights_ = std::move(weights);
  struct Held {
    const void* data;
    DType dtype;
    std::vector<int64_t> shape;  // local
  };
  std::map<std::string, Held> held;
  for (const TensorShard& ts : rank_tensors(spec_, layout_, shard_.tp_rank, shard_.pp_rank)) {
    const WeightRef* ref = weights_->find(ts.name);
    if (!ref)
      fail(ErrorCode::kNotFound, weights_->describe(), ": tensor ", ts.name, " ", shape_string(ts.full_shape),
           " is missing; config.json describes a ", spec_.architecture, " that has it");
    if (ref->shape != ts.full_shape)
      fail(ErrorCode::kInvalidArgument, weights_->describe(), ": tensor ", ts.name, " has shape ",
           shape_string(ref->shape), " but config.json implies ", shape_string(ts.full_shape));
    const size_t esize = dtype_size(ref->dtype);
    Held h{ref->data, ref->dtype, ts.local_shape};
    const int64_t n_bytes = shape_numel(ts.local_shape) * static_cast<int64_t>(esize);
    if (ts.split_dim == 0) {
      // Rows [begin, end) of a row-major tensor: contiguous, a view.
      const int64_t row_elems = ts.full_shape.size() > 1 ? ts.full_shape[1] : 1;
      h.data = static_cast<const char*>(ref->data) + static_cast<size_t>(ts.slice.begin * row_elems) * esize;
    } else if (ts.split_dim == 1 && ts.slice.size() != ts.full_shape[1]) {
      // Columns [begin, end): strided in the checkpoint, copied once.
      const int64_t rows = ts.full_shape[0], cols = ts.full_shape[1], w = ts.slice.size();
      auto buf = std::make_unique<uint8_t[]>(static_cast<size_t>(n_bytes));
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(buf.get() + static_cast<size_t>(r * w) * esize,
                    static_cast<const char*>(ref->data) + static_cast<size_t>(r * cols + ts.slice.begin) * esize,
                    static_cast<size_t>(w) * esize);
      h.data = buf.get();
      owned_.push_back(std::move(buf));
      copied_bytes_ += n_bytes;
    }
    weight_bytes_ += n_bytes;
    held.emplace(ts.name, std::move(h));
  }
  auto get = [&](const std::string& name) -> const Held& {
    auto it = held.find(name);
    SHARDLM_CHECK(it != held.end(), "tensor ", name, " not in this rank's shard");
    return it->second;
  };
  auto matrix = [&](const std::string& name) {
    const Held& h = get(name);
    return backend::MatrixView{h.data, h.dtype, h.shape[0], h.shape[1]};
  };
  auto vec = [&](const std::string& name) {
    const Held& h = get(name);
    return backend::VectorView{h.data, h.dtype, h.shape[0]};
  };
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    DecoderLayerWeights w;
    w.layer = l;
    w.input_norm = vec(p + "input_layernorm.weight");
    w.post_norm = vec(p + "post_attention_layernorm.weight");
    w.q.w = matrix(p + "self_attn.q_proj.weight");
    w.k.w = matrix(p + "self_attn.k_proj.weight");
    w.v.w = matrix(p + "self_attn.v_proj.weight");
    if (graph_.qkv_bias) {
      w.q.b = vec(p + "self_attn.q_proj.bias");
      w.k.b = vec(p + "self_attn.k_proj.bias");
      w.v.b = vec(p + "self_attn.v_proj.bias");
    }
    if (graph_.qk_norm) {
      w.q_norm = vec(p + "self_attn.q_norm.weight");
      w.k_norm = vec(p + "self_attn.k_norm.weight");
    }
    w.o.w = matrix(p + "self_attn.o_proj.weight");
    w.gate.w = matrix(p + "mlp.gate_proj.weight");
    w.up.w = matrix(p + "mlp.up_proj.weight");
    w.down.w = matrix(p + "mlp.down_proj.weight");
    layers_.push_back(w);
  }
  if (shard_.first_stage) embed_ = matrix("model.embed_tokens.weight");
  if (shard_.last_stage) {
    final_norm_ = vec("model.norm.weight");
    lm_head_ = matrix(spec_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  }
}

KvCache CausalLM::make_kv_cache(int64_t n_blocks, int64_t block_size, DType dtype) const {
  return KvCache(shard_.layers.size(), n_blocks, block_size, shard_.kv_heads.size(), spec_.head_dim, dtype);
}

int64_t CausalLM::kv_block_bytes(int64_t block_size, DType dtype) const {
  return KvCache::block_bytes(shard_.layers.size(), block_size, shard_.kv_heads.size(), spec_.head_dim, dtype);
}

bool CausalLM::forward(const ForwardBatch& batch, KvCache& cache, float* logits) {
  if (layout_.pp == 1) {
    run_stage(batch, cache, is_driver() ? logits : nullptr);
    return is_driver();
  }
  run_stage(batch, cache, nullptr);
  if (!is_driver()) return false;
  receive_logits(batch, logits);
  return true;
}

void CausalLM::receive_logits(const ForwardBatch& batch, float* logits) {
  SHARDLM_CHECK(is_driver() && layout_.pp > 1, "receive_logits is for the driver of a pipeline");
  const int64_t n_logits = batch.n_logits();
  if (n_logits > 0)
    pp_.recv(logits, static_cast<size_t>(n_logits * spec_.vocab_size) * sizeof(float), layout_.pp - 1);
}

void CausalLM::run_stage(const ForwardBatch& batch, KvCache& cache, float* logits) {
  const int64_t n = batch.n_tokens(), h = spec_.hidden_size;
  SHARDLM_CHECK(cache.n_layers() == shard_.layers.size() && cache.n_kv_heads() == shard_.kv_heads.size(),
                "KV cache made for another shard");
  // Chunks → positions and attention descriptors.
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::vector<backend::AttentionSeq> seqs;
  std::vector<int64_t> logit_rows;
  int64_t begin = 0;
  for (const SequenceChunk& c : batch.seqs) {
    if (c.n_tokens < 1 || c.n_past < 0)
      fail(ErrorCode::kInvalidArgument, "forward batch: a sequence chunk needs at least one new token and n_past >= 0");
    for (int32_t t = 0; t < c.n_tokens; ++t) positions[begin + t] = c.n_past + t;
    seqs.push_back({begin, c.n_tokens, c.n_past, c.block_table.data(), static_cast<int64_t>(c.block_table.size())});
    if (c.need_logits) logit_rows.push_back(begin + c.n_tokens - 1);
    begin += c.n_tokens;
  }
  if (begin != n)
    fail(ErrorCode::kInvalidArgument, "forward batch: chunks hold ", begin, " tokens but token_ids has ", n);
  for (const auto& s : seqs) {
    const int64_t need = (s.n_past + s.n_tokens + cache.block_size() - 1) / cache.block_size();
    if (s.n_table < need)
      fail(ErrorCode::kInvalidArgument, "forward batch: a block table has ", s.n_table, " blocks; ", s.n_past + s.n_tokens,
           " positions need ", need);
  }
  hidden_.resize(static_cast<size_t>(n * h));
  if (shard_.first_stage) {
    embed_tokens(embed_, shard_.vocab, spec_.vocab_size, batch.token_ids.data(), n, hidden_.data(), tp_);
  } else {
    pp_.recv(hidden_.data(), hidden_.size() * sizeof(float), shard_.pp_rank - 1);
  }
  StepTokens step{n, positions.data(), seqs.data(), static_cast<int64_t>(seqs.size())};
  for (size_t i = 0; i < layers_.size(); ++i) {
    attention_block(dims_, layers_[i], inv_freq_.data(), cache.layer(static_cast<int64_t>(i)), step, hidden_.data(),
                    tp_, scratch_);
    mlp_block(dims_, layers_[i], step, hidden_.data(), tp_, scratch_);
  }
  if (!shard_.last_stage) {
    pp_.send_async(hidden_.data(), hidden_.size() * sizeof(float), shard_.pp_rank + 1);
    return;
  }
  const int64_t n_logits = static_cast<int64_t>(logit_rows.size());
  if (n_logits == 0) return;
  const size_t logits_count = static_cast<size_t>(n_logits * spec_.vocab_size);
  std::vector<float> x(static_cast<size_t>(n_logits * h));  // [n_logits, hidden]
  for (int64_t i = 0; i < n_logits; ++i)
    std::memcpy(x.data() + i * h, hidden_.data() + logit_rows[i] * h, static_cast<size_t>(h) * sizeof(float));
  backend::rms_norm(x.data(), n_logits, final_norm_, dims_.eps, x.data());
  const bool deliver_here = shard_.tp_rank == 0 && logits != nullptr;
  std::vector<float> local_logits;
  float* out = logits;
  if (!deliver_here) {
    local_logits.resize(logits_count);
    out = local_logits.data();
  }
  lm_head_logits(x.data(), n_logits, lm_head_, vocab_ranges_, out, tp_);
  if (!deliver_here && shard_.tp_rank == 0 && layout_.pp > 1)
    pp_.send_async(out, logits_count * sizeof(float), 0);
}

}  // namespace shardlm
