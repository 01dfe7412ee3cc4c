#include "model/causal_lm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "core/error.h"
#include "model/quantized_linear.h"

namespace shardlm {

namespace {

// Where load_weights keeps a held tensor: its name, and the part of a fused one.
std::string held_key(const std::string& name, int fused_part) {
  return fused_part < 0 ? name : name + "#" + std::to_string(fused_part);
}

}  // namespace

RankComms split_rank_comms(Communicator& world, const Layout& layout) {
  const int tp = layout.tp, rank = world.rank();
  SHARDLM_CHECK(world.size() == layout.tp * layout.pp, "world of ", world.size(), " ranks for ", layout.to_string());
  RankComms c;
  c.tp = world.split(rank / tp, rank % tp);  // same stage
  c.pp = world.split(rank % tp, rank / tp);  // same tp rank
  return c;
}

CausalLM::CausalLM(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank, Communicator& tp,
                   Communicator& pp, std::shared_ptr<backend::Backend> backend)
    : spec_(spec), layout_(layout), shard_(shard_for(spec, layout, tp_rank, pp_rank)), family_(decoder_family(spec)),
      tp_(tp), pp_(pp), backend_(std::move(backend)) {
  SHARDLM_CHECK(backend_ != nullptr, "CausalLM needs a backend");
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
  if (spec.is_moe() && !backend_->supports(backend::OpArgs::of(backend::Op::kMoe)))
    fail(ErrorCode::kUnsupported, spec.architecture, " is a mixture-of-experts model; the ", backend_->name(),
         " backend does not implement the MoE ops (moe_route, moe_experts) yet; run it on the CPU backend");
  // Every layer sparse (Mixtral, Qwen3-MoE without mlp_only_layers): no dense
  // MLP buffers.
  if (spec.is_moe() && spec.n_moe_layers() == spec.n_layers) dims_.inter_local = 0;
  if (spec.is_moe()) {
    dims_.n_experts = spec.n_experts;
    dims_.top_k = spec.n_experts_per_token;
    dims_.renormalize = spec.norm_topk_prob;
  }
  dims_.eps = static_cast<float>(spec.rms_norm_eps);
  dims_.norm_offset = spec.norm_weight_offset;
  dims_.activation = spec.mlp_activation;
  dims_.heads = {shard_.q_heads.size(), shard_.q_heads.begin, shard_.kv_heads.begin, spec.group_size()};
  backend::RopeConfig rope = rope_config(spec);
  const int64_t half = rope.head_dim / 2;
  // LongRoPE: [2, half], the short factors' frequencies, then the long ones'.
  const int64_t n_tables = spec.rope_scaling.type == "longrope" ? 2 : 1;
  std::vector<float> inv_freq(static_cast<size_t>(n_tables * half));
  backend::rope_inv_freq(rope, inv_freq.data());
  if (n_tables == 2) {
    rope.ext_factors = spec.rope_scaling.long_factor;
    backend::rope_inv_freq(rope, inv_freq.data() + half);
    long_rope_from_ = spec.long_rope_from();
  }
  inv_freq_ = n_tables == 2 ? backend_->alloc(DType::kF32, {2, half}) : backend_->alloc(DType::kF32, {half});
  backend_->upload(inv_freq.data(), inv_freq_);
  if (spec.rope_scaling.type == "longrope") dims_.rope_mscale = static_cast<float>(spec.rope_scaling.attention_factor);
  if (spec.rope_local_theta > 0.0) {
    inv_freq.resize(static_cast<size_t>(spec.head_dim / 2));
    backend::rope_inv_freq(local_rope_config(spec), inv_freq.data());
    inv_freq_local_ = backend_->alloc(DType::kF32, {spec.head_dim / 2});
    backend_->upload(inv_freq.data(), inv_freq_local_);
  }
  if (spec.query_pre_attn_scalar > 0.0 && spec.query_pre_attn_scalar != static_cast<double>(spec.head_dim))
    dims_.heads.scale = static_cast<float>(1.0 / std::sqrt(spec.query_pre_attn_scalar));
  if (spec.scale_embeddings) {
    // transformers: embed × sqrt(hidden_size) cast to the weights' dtype.
    uint32_t stored = 0;
    store_from_f32(&stored, spec.dtype, 0, std::sqrt(static_cast<float>(spec.hidden_size)));
    embed_scale_ = load_as_f32(&stored, spec.dtype, 0);
  }
  for (const bool sliding : {false, true}) {
    if (sliding && spec.sliding_layers.empty()) continue;
    backend::AttentionHeads heads = dims_.heads;
    heads.window = sliding ? spec.sliding_window : 0;
    const backend::OpArgs args = backend::OpArgs::attention(heads, spec.head_dim);
    if (!backend_->supports(args))
      fail(ErrorCode::kUnsupported, spec.architecture, ": the ", backend_->name(), " backend cannot compute its ",
           sliding ? str_cat("sliding-window attention (", spec.sliding_window, " positions)")
                   : std::string("attention"),
           ": ", backend_->unsupported(args), "; run this model on the CPU backend");
  }
  for (int r = 0; r < layout.tp; ++r) vocab_ranges_.push_back(shard_for(spec, layout, r, pp_rank).vocab);
}

std::unique_ptr<CausalLM> CausalLM::load(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                         const Layout& layout, int tp_rank, int pp_rank, Communicator& tp,
                                         Communicator& pp, std::shared_ptr<backend::Backend> backend) {
  std::unique_ptr<CausalLM> m(new CausalLM(spec, layout, tp_rank, pp_rank, tp, pp, std::move(backend)));
  m->load_weights(std::move(weights));
  return m;
}

std::unique_ptr<CausalLM> CausalLM::load_dir(const std::filesystem::path& model_dir, const Layout& layout,
                                             int tp_rank, int pp_rank, Communicator& tp, Communicator& pp,
                                             std::shared_ptr<backend::Backend> backend) {
  ModelSpec spec = load_model_config(model_dir / "config.json");
  return load(spec, open_checkpoint(model_dir), layout, tp_rank, pp_rank, tp, pp, std::move(backend));
}

void CausalLM::load_weights(std::shared_ptr<const WeightSource> weights) {
  weights_ = std::move(weights);
  backend::Backend& b = *backend_;
  if (spec_.quant.enabled()) b.require(backend::OpArgs::quant_matmul(weight_scheme(spec_.quant), spec_.quant.bits));
  const int64_t allocated_before = b.allocated_bytes();
  std::map<std::string, TensorSpec> specs;
  for (TensorSpec& t : expected_tensors(spec_)) specs.emplace(t.name, std::move(t));
  std::vector<TensorShard> shards = rank_tensors(spec_, layout_, shard_.tp_rank, shard_.pp_rank);
  std::map<std::string, const TensorShard*> by_name;
  for (const TensorShard& ts : shards) by_name[ts.name] = &ts;
  {
    // What adopt_weight will be asked for, so a device backend can take it in one allocation.
    int64_t total = 0, n = 0;
    for (const TensorShard& ts : shards)
      if (const WeightRef* ref = weights_->find(ts.name)) {
        int64_t numel = 1;
        for (int64_t d : ts.local_shape) numel *= d;
        total += numel * static_cast<int64_t>(dtype_size(ref->dtype));
        ++n;
      }
    b.reserve_weights(total, n);
  }
  for (const auto& [name, t] : specs)
    if (t.expert >= 0 && t.part != QuantPart::kNone)
      fail(ErrorCode::kUnsupported, weights_->describe(), ": ", t.module, " is quantized (", spec_.quant.describe(),
           "); shardlm runs quantized dense Linears, not quantized MoE experts yet");
  std::map<std::string, HeldTensor> held;
  for (TensorShard ts : shards) {
    const WeightRef* ref = weights_->find(ts.name);
    if (!ref)
      fail(ErrorCode::kNotFound, weights_->describe(), ": tensor ", ts.name, " ", shape_string(ts.full_shape),
           " is missing; config.json describes a ", spec_.architecture, spec_.quant.enabled() ? " quantized as " : "",
           spec_.quant.enabled() ? spec_.quant.describe() : "", " that has it");
    auto sit = specs.find(ts.name);
    const TensorSpec* tspec = sit == specs.end() ? nullptr : &sit->second;
    if (ref->shape != ts.full_shape) {
      const bool other = tspec && std::find(tspec->other_shapes.begin(), tspec->other_shapes.end(), ref->shape) !=
                                      tspec->other_shapes.end();
      if (!other) {
        std::string accepted = shape_string(ts.full_shape);
        if (tspec)
          for (const auto& o : tspec->other_shapes) accepted += " or " + shape_string(o);
        fail(ErrorCode::kInvalidArgument, weights_->describe(), ": tensor ", ts.name, " has shape ",
             shape_string(ref->shape), " but config.json", spec_.quant.enabled() ? " (" + spec_.quant.describe() + ")" : "",
             " implies ", accepted);
      }
      // FP8 per-channel scales [N] / [N, 1] follow their weight's output rows; one scale is replicated.
      ts.full_shape = ref->shape;
      ts.local_shape = ref->shape;
      ts.split_dim = -1;
      ts.slice = {0, ref->shape.empty() ? 1 : ref->shape[0]};
      const auto wit = by_name.find(tspec->module + ".weight");
      if (shape_numel(ref->shape) > 1 && wit != by_name.end() && wit->second->split_dim == 0) {
        ts.split_dim = 0;
        ts.slice = wit->second->slice;
        ts.local_shape[0] = ts.slice.size();
      }
    }
    if (tspec) check_part_dtype(spec_, *tspec, ref->dtype, weights_->describe());
    const size_t esize = dtype_size(ref->dtype);
    const TensorShape local_shape{std::span<const int64_t>(ts.local_shape)};
    Tensor host;
    if (ts.split_dim == 1 && ts.slice.size() != ts.full_shape[1]) {
      // Columns [begin, end): strided in the checkpoint, copied once.
      const int64_t rows = ts.full_shape[0], cols = ts.full_shape[1], w = ts.slice.size();
      host = Tensor::host(ref->dtype, local_shape);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(static_cast<char*>(host.data()) + static_cast<size_t>(r * w) * esize,
                    static_cast<const char*>(ref->data) + static_cast<size_t>(r * cols + ts.slice.begin) * esize,
                    static_cast<size_t>(w) * esize);
    } else {
      // Whole, or rows [begin, end) of a row-major tensor: contiguous, a view.
      const int64_t row_elems = ts.full_shape.size() > 1 ? shape_numel(ts.full_shape) / ts.full_shape[0] : 1;
      const int64_t first = ts.split_dim == 0 ? ts.slice.begin * row_elems : 0;
      host = Tensor::view(static_cast<const char*>(ref->data) + static_cast<size_t>(first) * esize, ref->dtype,
                          local_shape);
    }
    Tensor adopted = b.adopt_weight(std::move(host));
    held.emplace(held_key(ts.name, ts.fused_part), HeldTensor{std::move(adopted), ts});
  }
  copied_bytes_ = b.allocated_bytes() - allocated_before;
  // Views that stayed views are mapped checkpoint bytes; what a backend copied
  // (column slices; every weight on a GPU) is what its allocator obtained.
  weight_bytes_ = copied_bytes_;
  for (const auto& [name, t] : held)
    if (!t.tensor.owns_storage()) weight_bytes_ += static_cast<int64_t>(t.tensor.nbytes());
  auto get = [&](const std::string& name) -> const Tensor& {
    auto it = held.find(name);
    SHARDLM_CHECK(it != held.end(), "tensor ", name, " not in this rank's shard");
    return it->second.tensor;
  };
  // Each tensor goes where its slot says (the family's table in
  // loader/families/ names it); a Linear is assembled at its primary part.
  std::vector<DecoderLayerWeights> layers(static_cast<size_t>(shard_.layers.size()));
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) {
    DecoderLayerWeights& w = layers[static_cast<size_t>(l - shard_.layers.begin)];
    w.layer = l;
    w.expert_begin = shard_.experts.begin;
    if (spec_.is_sliding_layer(l)) {
      w.attention_window = spec_.sliding_window;
      w.local_rope = spec_.rope_local_theta > 0.0;
    }
  }
  for (const auto& [name, tspec] : specs) {
    const TensorSpec& t = tspec;
    if (t.role == ShardRole::kFusedParts) {  // each part is its own Linear: rows of the fused tensor
      if (!shard_.layers.contains(t.layer)) continue;
      DecoderLayerWeights& w = layers[static_cast<size_t>(t.layer - shard_.layers.begin)];
      for (size_t p = 0; p < t.fused.size(); ++p) {
        const Tensor& part = get(held_key(name, static_cast<int>(p)));
        switch (t.fused[p].slot) {
          case TensorSlot::kQ: w.q.weight = part; break;
          case TensorSlot::kK: w.k.weight = part; break;
          case TensorSlot::kV: w.v.weight = part; break;
          case TensorSlot::kGate: w.gate.weight = part; break;
          case TensorSlot::kUp: w.up.weight = part; break;
          default:
            fail(ErrorCode::kInternal, "tensor ", name, ": fused part of slot ", tensor_slot_name(t.fused[p].slot));
        }
      }
      continue;
    }
    if (held.find(name) == held.end()) continue;  // another rank's or stage's, or an absent optional
    if (t.layer < 0) {
      if (t.slot == TensorSlot::kEmbedding && shard_.first_stage) embed_ = get(name);
      if (t.slot == TensorSlot::kFinalNorm) final_norm_ = get(name);
      if (t.slot == TensorSlot::kLmHead && t.part == QuantPart::kNone) lm_head_ = Linear{get(name), Tensor{}, {}};
      // GPTQ "lm_head": true: the parts put together at qweight, as a decoder Linear.
      if (t.slot == TensorSlot::kLmHead && t.part != QuantPart::kNone && t.primary())
        lm_head_ = assemble_linear(spec_, t.module, held, weights_->describe());
      continue;
    }
    DecoderLayerWeights& w = layers[static_cast<size_t>(t.layer - shard_.layers.begin)];
    auto linear = [&](Linear& dst) {
      if (!t.primary()) return;
      Tensor bias = dst.bias;  // a bias placed before its weight (the map orders ".bias" first)
      dst = assemble_linear(spec_, t.module, held, weights_->describe());
      dst.bias = bias;
    };
    auto expert = [&](int part) -> Tensor& {
      const size_t e = static_cast<size_t>(t.expert - shard_.experts.begin);
      if (w.experts.size() <= e) w.experts.resize(e + 1);
      ExpertLinears& x = w.experts[e];
      return part == 0 ? x.gate : part == 1 ? x.up : x.down;
    };
    switch (t.slot) {
      case TensorSlot::kAttnNorm: w.attn_norm = get(name); break;
      case TensorSlot::kMlpNorm: w.mlp_norm = get(name); break;
      case TensorSlot::kPostAttnNorm: w.post_attn_norm = get(name); break;
      case TensorSlot::kPostMlpNorm: w.post_mlp_norm = get(name); break;
      case TensorSlot::kQ: linear(w.q); break;
      case TensorSlot::kK: linear(w.k); break;
      case TensorSlot::kV: linear(w.v); break;
      case TensorSlot::kO: linear(w.o); break;
      case TensorSlot::kQBias: w.q.bias = get(name); break;
      case TensorSlot::kKBias: w.k.bias = get(name); break;
      case TensorSlot::kVBias: w.v.bias = get(name); break;
      case TensorSlot::kQNorm: w.q_norm = get(name); break;
      case TensorSlot::kKNorm: w.k_norm = get(name); break;
      case TensorSlot::kGate: linear(w.gate); break;
      case TensorSlot::kUp: linear(w.up); break;
      case TensorSlot::kDown: linear(w.down); break;
      case TensorSlot::kRouter: w.router.weight = get(name); break;
      case TensorSlot::kExpertGate:
      case TensorSlot::kExpertUp:
      case TensorSlot::kExpertDown:
        expert(t.slot == TensorSlot::kExpertGate ? 0 : t.slot == TensorSlot::kExpertUp ? 1 : 2) = get(name);
        break;
      case TensorSlot::kEmbedding:
      case TensorSlot::kFinalNorm:
      case TensorSlot::kLmHead:
        fail(ErrorCode::kInternal, "tensor ", name, ": slot ", tensor_slot_name(t.slot), " inside decoder layer ", t.layer);
    }
  }
  layers_ = std::move(layers);
  // A tied model's last stage reads the embedding rows as its lm_head.
  if (shard_.last_stage && spec_.tie_word_embeddings) {
    for (const auto& [name, t] : specs)
      if (t.slot == TensorSlot::kEmbedding) lm_head_ = Linear{get(name), Tensor{}, {}};
  }
  if (shard_.first_stage) SHARDLM_CHECK(embed_.defined(), "no embedding in this rank's shard");
  if (shard_.last_stage)
    SHARDLM_CHECK(final_norm_.defined() && (lm_head_.weight.defined() || lm_head_.quantized()), "no final norm or lm_head");
}

KvCache CausalLM::make_kv_cache(int64_t n_blocks, int64_t block_size, DType dtype, int64_t n_local_blocks) const {
  std::vector<bool> local(static_cast<size_t>(shard_.layers.size()), false);
  if (n_local_blocks > 0)
    for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l)
      local[static_cast<size_t>(l - shard_.layers.begin)] = spec_.is_sliding_layer(l);
  if (n_local_blocks > 0) backend_->require(backend::OpArgs::of(backend::Op::kKvGroups));
  return KvCache(*backend_, shard_.layers.size(), n_blocks, block_size, shard_.kv_heads.size(), spec_.head_dim, dtype,
                 local, n_local_blocks);
}

int64_t CausalLM::kv_local_block_bytes(int64_t block_size, DType dtype) const {
  int64_t n = 0;
  for (int64_t l = shard_.layers.begin; l < shard_.layers.end; ++l) n += spec_.is_sliding_layer(l) ? 1 : 0;
  return KvCache::block_bytes(n, block_size, shard_.kv_heads.size(), spec_.head_dim, dtype);
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

void CausalLM::forward_sampled(const ForwardBatch& batch, KvCache& cache,
                               std::span<const backend::DeviceSampleRow> rows, int32_t* ids, float* logprobs) {
  if (layout_.tp > 1 || layout_.pp > 1 || !backend_->supports(backend::OpArgs::of(backend::Op::kSampleRows)))
    fail(ErrorCode::kUnsupported, "sampling on the device needs TP = PP = 1 and a backend with a device sampler; ",
         backend_->name(), " at ", layout_.to_string(), " samples on the host");
  const int64_t n_logits = batch.n_logits();
  SHARDLM_CHECK(static_cast<int64_t>(rows.size()) == n_logits, "forward_sampled: ", rows.size(), " rows for ",
                n_logits, " logits");
  run_stage(batch, cache, nullptr);  // the logits stay in logits_out_ (the graph path's too)
  if (n_logits > 0) backend_->sample_rows(logits_out_.slice_rows(0, n_logits), rows, ids, logprobs);
}

void CausalLM::receive_logits(const ForwardBatch& batch, float* logits) {
  SHARDLM_CHECK(is_driver() && layout_.pp > 1, "receive_logits is for the driver of a pipeline");
  const int64_t n_logits = batch.n_logits();
  if (n_logits > 0)
    pp_.recv(logits, static_cast<size_t>(n_logits * spec_.vocab_size) * sizeof(float), layout_.pp - 1);
}

void CausalLM::pack_step(const ForwardBatch& batch, const KvCache& cache, int64_t n_padding) {
  meta_.clear();
  int64_t begin = 0;
  for (const SequenceChunk& c : batch.seqs) {
    if (c.n_tokens < 1 || c.n_past < 0 || begin + c.n_tokens > batch.n_tokens())
      fail(ErrorCode::kInvalidArgument,
           "forward batch: a sequence chunk needs at least one new token and n_past >= 0, within token_ids");
    const int64_t need = (static_cast<int64_t>(c.n_past) + c.n_tokens + cache.block_size() - 1) / cache.block_size();
    if (static_cast<int64_t>(c.block_table.size()) < need)
      fail(ErrorCode::kInvalidArgument, "forward batch: a block table has ", c.block_table.size(), " blocks; ",
           c.n_past + c.n_tokens, " positions need ", need);
    if (cache.n_local_layers() > 0 && static_cast<int64_t>(c.local_block_table.size()) < need)
      fail(ErrorCode::kInvalidArgument, "forward batch: a local block table has ", c.local_block_table.size(),
           " blocks; ", c.n_past + c.n_tokens, " positions need ", need,
           " (this rank's sliding-window layers keep their KV in a pool of their own)");
    const int64_t long_from = long_rope_from_ == 0 ? backend::StepMetadata::kNoLongRope
                              : c.long_context        ? 0
                                                      : long_rope_from_;
    meta_.add_seq(std::span<const int32_t>(batch.token_ids).subspan(static_cast<size_t>(begin), static_cast<size_t>(c.n_tokens)),
                  c.n_past, c.block_table, c.n_logit_rows(), static_cast<int32_t>(long_from), c.local_block_table);
    begin += c.n_tokens;
  }
  if (begin != batch.n_tokens())
    fail(ErrorCode::kInvalidArgument, "forward batch: chunks hold ", begin, " tokens but token_ids has ",
         batch.n_tokens());
  meta_.add_padding_rows(n_padding);
  meta_.finish();
}

void CausalLM::reserve_step_buffers(int64_t n_tokens, int64_t n_logits) {
  backend::Backend& b = *backend_;
  const int64_t h = spec_.hidden_size;
  if (n_tokens > hidden_capacity_) {
    hidden_ = b.alloc(b.activation_dtype(), {n_tokens, h});
    hidden_capacity_ = n_tokens;
  }
  workspace_.reserve(b, dims_, n_tokens);
  if (shard_.last_stage && n_logits > logits_capacity_) {
    const DType a = b.activation_dtype();
    last_hidden_ = b.alloc(a, {n_logits, h});
    if (layout_.tp > 1) {
      logits_local_ = b.alloc(a, {n_logits, shard_.vocab.size()});
      logits_gathered_ = b.alloc(a, {n_logits, spec_.vocab_size});
    }
    logits_out_ = b.alloc(DType::kF32, {n_logits, spec_.vocab_size});
    logits_capacity_ = n_logits;
  }
}

void CausalLM::run_layers(Tensor& hidden, KvCache& cache) {
  const StepContext step{meta_, inv_freq_, inv_freq_local_};
  const LayerContext c{*backend_, dims_, step, tp_, workspace_, dump_};
  for (size_t i = 0; i < layers_.size(); ++i)
    family_.layer(c, layers_[i], cache.layer(static_cast<int64_t>(i)), hidden);
}

void CausalLM::make_logits(const Tensor& hidden, Tensor& out) {
  backend::Backend& b = *backend_;
  const int64_t n_logits = meta_.n_logits();
  Tensor x = last_hidden_.slice_rows(0, n_logits);  // [n_logits, hidden]
  b.gather_logit_rows(hidden, meta_, x);
  b.rms_norm(x, {final_norm_, dims_.norm_offset}, dims_.eps, x);
  if (dump_) dump_->record(b, "result_norm", -1, x);
  Tensor local = logits_local_.defined() ? logits_local_.slice_rows(0, n_logits) : Tensor{};
  Tensor gathered = logits_gathered_.defined() ? logits_gathered_.slice_rows(0, n_logits) : Tensor{};
  lm_head_logits(b, x, lm_head_, vocab_ranges_, out, local, gathered, tp_);
  // Gemma's final_logit_softcapping, on the gathered rows every sampler reads.
  if (spec_.final_logit_softcapping > 0.0) b.softcap(out, static_cast<float>(spec_.final_logit_softcapping));
}

void CausalLM::run_stage(const ForwardBatch& batch, KvCache& cache, float* logits) {
  SHARDLM_CHECK(cache.n_layers() == shard_.layers.size() && cache.n_kv_heads() == shard_.kv_heads.size(),
                "KV cache made for another shard");
  if (graphs_ && run_graph_step(batch, cache, logits)) return;
  pack_step(batch, cache, 0);
  backend::Backend& b = *backend_;
  const int64_t n = meta_.n_tokens();
  b.begin_step(meta_);
  reserve_step_buffers(n, meta_.n_logits());
  Tensor hidden = hidden_.slice_rows(0, n);  // [n_tokens, hidden]
  if (shard_.first_stage) {
    embed_tokens(b, embed_, shard_.vocab, spec_.vocab_size, meta_, hidden, tp_, embed_scale_);
    if (dump_) dump_->record(b, "embd", -1, hidden);
  } else {
    pp_.recv(hidden.data(), hidden.nbytes(), shard_.pp_rank - 1);
  }
  run_layers(hidden, cache);
  if (!shard_.last_stage) {
    b.synchronize();
    pp_.send_async(hidden.data(), hidden.nbytes(), shard_.pp_rank + 1);
    return;
  }
  const int64_t n_logits = meta_.n_logits();
  if (n_logits == 0) return;
  const bool deliver_here = shard_.tp_rank == 0 && logits != nullptr;
  // On a host backend the driver's buffer is written directly; otherwise the
  // logits land in the rank's own buffer and are copied out.
  Tensor out = deliver_here && b.device().is_cpu() ? Tensor::view(logits, DType::kF32, {n_logits, spec_.vocab_size})
                                                   : logits_out_.slice_rows(0, n_logits);
  make_logits(hidden, out);
  if (deliver_here && !b.device().is_cpu()) b.download(out, logits);
  if (!deliver_here && shard_.tp_rank == 0 && layout_.pp > 1) {
    b.synchronize();
    pp_.send_async(out.data(), out.nbytes(), 0);
  }
}

// ---- decode steps through graphs ---------------------------------------------

std::string CausalLM::enable_decode_graphs(const backend::DecodeGraphOptions& options,
                                           std::function<void(const std::string&)> log) {
  graphs_.reset();
  if (!options.enabled) return "CUDA graphs: off";
  auto off = [](const std::string& why) { return "CUDA graphs: off (" + why + "); decode steps run eagerly"; };
  if (layout_.tp > 1 || layout_.pp > 1)
    return off(str_cat("layout ", layout_.to_string(),
                       ": graphs are captured for TP = PP = 1 only; the collectives between ranks are not captured"));
  if (spec_.is_moe()) return off("mixture-of-experts layers route on the host and are not captured");
  if (dump_) return off("intermediates are being dumped");
  backend::Backend& b = *backend_;
  // Steps that do not fit (more sequences, a longer context, any prefill) run
  // eagerly; the graph path itself only ever runs on the driver (TP = PP = 1).
  std::unique_ptr<backend::GraphStepRunner> runner =
      b.make_graph_runner([this](int n_rows) { enqueue_graph_step(n_rows); });
  if (!runner) return off(str_cat(b.name(), " has no graphs"));
  if (!log) log = [](const std::string& line) { std::fprintf(stderr, "shardlm: %s\n", line.c_str()); };
  graphs_ = std::make_unique<backend::DecodeGraphs>(options, std::move(runner), std::move(log));
  // Every buffer a graph step touches is allocated now at the largest
  // bucket's size, so that steps up to it never move them.
  reserve_step_buffers(options.max_batch, options.max_batch);
  return "CUDA graphs: " + graphs_->describe();
}

bool CausalLM::run_graph_step(const ForwardBatch& batch, KvCache& cache, float* logits) {
  const int64_t n_seqs = static_cast<int64_t>(batch.seqs.size());
  bool all_decode = n_seqs > 0 && batch.n_tokens() == n_seqs;
  int64_t max_context = 0;
  for (const SequenceChunk& c : batch.seqs) {
    all_decode = all_decode && c.n_tokens == 1 && c.need_logits && !c.all_logits;
    max_context = std::max<int64_t>(max_context, static_cast<int64_t>(c.n_past) + c.n_tokens);
  }
  const int bucket = graphs_->bucket_for(n_seqs, all_decode, max_context);
  if (bucket < 0) return false;
  // A replay runs none of the ops' host-side checks: the ones that look at
  // user input happen here first.
  for (int32_t id : batch.token_ids)
    if (id < 0 || id >= spec_.vocab_size)
      fail(ErrorCode::kInvalidArgument, "token id ", id, " is outside the vocabulary [0, ", spec_.vocab_size, ")");
  pack_step(batch, cache, bucket - n_seqs);  // [bucket] rows: the sequences, then padding
  backend::Backend& b = *backend_;
  b.set_decode_graph_bounds(graphs_->options().max_batch, graphs_->options().max_context);
  // The step's metadata goes into the backend's fixed device buffer here,
  // outside the graph, which reads it from there.
  b.begin_step(meta_);
  reserve_step_buffers(bucket, bucket);
  backend::GraphBufferKey key;
  key.backend_epoch = b.buffer_epoch();
  for (const Tensor* t : {&hidden_, &last_hidden_, &logits_out_, &logits_local_, &logits_gathered_, &inv_freq_,
                          &inv_freq_local_})
    key.addresses.push_back(t->defined() ? t->data() : nullptr);
  for (const Tensor& t : {workspace_.normed(1), workspace_.q(1), workspace_.k(1), workspace_.v(1), workspace_.attn(1),
                          workspace_.proj(1), workspace_.gate(1), workspace_.up(1)})
    key.addresses.push_back(t.defined() ? t.data() : nullptr);
  for (int64_t l = 0; l < cache.n_layers(); ++l) {
    const backend::KvLayerView v = cache.layer(l);
    key.addresses.push_back(v.k);
    key.addresses.push_back(v.v);
  }
  key.addresses.push_back(reinterpret_cast<const void*>(static_cast<intptr_t>(cache.n_blocks() * cache.block_size())));
  graph_kv_ = &cache;
  try {
    graphs_->run(bucket, key);
  } catch (...) {
    graph_kv_ = nullptr;
    b.set_decode_graph_bounds(0, 0);
    throw;
  }
  graph_kv_ = nullptr;
  b.set_decode_graph_bounds(0, 0);
  if (logits != nullptr) {
    // Only the real rows come back; the padding rows' logits stay on the device.
    if (b.device().is_cpu()) {
      std::memcpy(logits, logits_out_.data(), static_cast<size_t>(n_seqs * spec_.vocab_size) * sizeof(float));
    } else {
      b.download(logits_out_.slice_rows(0, n_seqs), logits);
    }
  }
  return true;
}

void CausalLM::enqueue_graph_step(int n_rows) {
  SHARDLM_CHECK(graph_kv_ != nullptr && n_rows == meta_.n_tokens() && n_rows == meta_.n_logits(),
                "a decode graph step of ", n_rows, " rows outside run_graph_step (", meta_.n_tokens(), " packed)");
  backend::Backend& b = *backend_;
  Tensor hidden = hidden_.slice_rows(0, n_rows);  // [bucket, hidden]
  embed_tokens(b, embed_, shard_.vocab, spec_.vocab_size, meta_, hidden, tp_, embed_scale_);
  run_layers(hidden, *graph_kv_);
  Tensor out = logits_out_.slice_rows(0, n_rows);  // [bucket, vocab]
  make_logits(hidden, out);
}

int64_t CausalLM::embedding_only_bytes() const {
  if (!embed_.defined()) return 0;
  if (lm_head_.weight.defined() && lm_head_.weight.data() == embed_.data()) return 0;
  return static_cast<int64_t>(embed_.nbytes());
}

}  // namespace shardlm
