// A decoder-only causal LM as one rank of a TP × PP group holds it: the
// weight slices plan's rank_tensors names (row slices are views into the
// checkpoint mapping; column slices of o_proj/down_proj are copied into rank
// buffers in the checkpoint dtype), the layers of its pipeline stage, and the
// communicators of its tensor-parallel group and its pipeline.
//
// Every rank of the group calls forward with the same ForwardBatch. Stage 0
// embeds; each stage runs its layers and sends hidden states [n_tokens,
// hidden] f32 to the next; the last stage applies the final norm and the
// vocab-parallel lm_head and hands the logits to the driver (tp 0, pp 0).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device/decode_graphs.h"
#include "comm/communicator.h"
#include "model/families/family.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/layers.h"
#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

// The two groups a rank belongs to. tp: the ranks of its stage, rank() ==
// tp_rank. pp: the ranks with its tp_rank across stages, rank() == pp_rank.
struct RankComms {
  std::unique_ptr<Communicator> tp;
  std::unique_ptr<Communicator> pp;
};
// Splits a world (or replica) communicator of layout.tp × layout.pp ranks
// (world rank = pp_rank × tp + tp_rank). Collective over `world`.
RankComms split_rank_comms(Communicator& world, const Layout& layout);

class CausalLM {
 public:
  // Loads this rank's slices from weights onto the rank's backend. Throws
  // kNotFound / kInvalidArgument naming the tensor when one is missing or
  // shaped differently than spec says.
  static std::unique_ptr<CausalLM> load(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                        const Layout& layout, int tp_rank, int pp_rank, Communicator& tp,
                                        Communicator& pp, std::shared_ptr<backend::Backend> backend);
  // config.json + *.safetensors of an HF model directory.
  static std::unique_ptr<CausalLM> load_dir(const std::filesystem::path& model_dir, const Layout& layout, int tp_rank,
                                            int pp_rank, Communicator& tp, Communicator& pp,
                                            std::shared_ptr<backend::Backend> backend);

  // A KV cache for this rank's layers and KV heads, on the rank's backend.
  // n_local_blocks > 0 (hybrid models such as Gemma 3): the rank's
  // sliding-window layers keep their KV in a pool of that many blocks of
  // their own, addressed by the chunks' local block tables.
  KvCache make_kv_cache(int64_t n_blocks, int64_t block_size, DType dtype, int64_t n_local_blocks = 0) const;
  // Bytes one KV block takes on this rank over all its layers (what the
  // block pool divides by when every layer shares it).
  int64_t kv_block_bytes(int64_t block_size, DType dtype) const;
  // The part of kv_block_bytes that the rank's sliding-window layers take (0 without any).
  int64_t kv_local_block_bytes(int64_t block_size, DType dtype) const;

  // Runs one step, one batch at a time: run_stage, then on the driver of a
  // pipeline receive_logits. logits: [batch.n_logits(), vocab_size] f32,
  // written on the driver rank only (may be nullptr elsewhere); the rows
  // follow the order of the sequences with need_logits. Returns true where
  // logits were written.
  bool forward(const ForwardBatch& batch, KvCache& cache, float* logits);
  // forward, with the logits sampled where they are (Backend::sample_rows):
  // rows[i] samples the i-th sequence with need_logits; ids and logprobs
  // ([batch.n_logits()], host) get the chosen tokens. TP = PP = 1 and a
  // backend with a device sampler only (kUnsupported otherwise).
  void forward_sampled(const ForwardBatch& batch, KvCache& cache, std::span<const backend::DeviceSampleRow> rows,
                       int32_t* ids, float* logprobs);

  // The step split for pipelining, so that a stage can start batch k+1 while
  // later stages still run batch k. run_stage: the first stage embeds, the
  // others receive the previous stage's hidden states [n_tokens, hidden];
  // this stage's layers run; then the hidden states go on to the next stage,
  // or, on the last stage, the logits are made and tp rank 0 delivers them:
  // into `logits` when given (a caller that shares memory with the driver),
  // else sent to pipeline rank 0. Every send is asynchronous, so stages never
  // wait for their successors. Each rank runs batches in the same order.
  void run_stage(const ForwardBatch& batch, KvCache& cache, float* logits);
  // Pipeline rank 0 of tp rank 0 (the driver), pp > 1: receives the logits
  // the last stage sent for `batch` (batches are received in run order).
  void receive_logits(const ForwardBatch& batch, float* logits);

  // Decode steps through graphs (backend/device/decode_graphs.h) from now
  // on, where they can be: the backend has a graph runner (CUDA), TP = PP =
  // 1, a dense model. A qualifying step (every sequence decodes one token
  // with logits, at most options.max_batch of them, contexts up to
  // options.max_context) is padded to its bucket and replayed from a graph
  // captured after one eager warm-up; every other step runs eagerly as
  // before. The buffers graph steps touch are allocated here, at the largest
  // bucket's size. Returns the startup log's line ("CUDA graphs: on: ..." or
  // "CUDA graphs: off (why)"). log: where a failed capture is reported (one
  // line per bucket; default stderr). Throws kInvalidArgument for bad options.
  std::string enable_decode_graphs(const backend::DecodeGraphOptions& options,
                                   std::function<void(const std::string&)> log = {});
  const backend::DecodeGraphs* decode_graphs() const { return graphs_.get(); }

  bool is_driver() const { return shard_.tp_rank == 0 && shard_.pp_rank == 0; }
  const ModelSpec& spec() const { return spec_; }
  const Layout& layout() const { return layout_; }
  const RankShard& shard() const { return shard_; }
  const DecoderFamily& family() const { return family_; }
  backend::Backend& backend() const { return *backend_; }
  // Bytes of the weights this rank holds: the mapped checkpoint ranges its
  // views cover plus what its backend allocated for copies (column slices on
  // CPU; everything on a GPU). Equals plan's rank_weight_bytes when the
  // checkpoint stores spec.dtype throughout.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Bytes the backend's allocator obtained for weight copies (measured).
  int64_t copied_bytes() const { return copied_bytes_; }
  // Bytes of this rank's embedding table that a step does not stream: the
  // whole table where it is not also the lm_head (untied, or a quantized
  // lm_head beside it), of which a step reads one row per token; 0 where the
  // lm_head reads it whole, or where this rank has no table.
  int64_t embedding_only_bytes() const;
  // From now on, the intermediates each forward computes on this rank's
  // layers are handed to `dump` by (name, layer) (model/tensor_dump.h);
  // nullptr stops. dump must outlive the calls. Decode graphs stay off
  // while a dump is attached (a replay runs no host code).
  void dump_tensors(TensorDump* dump) { dump_ = dump; }
  // hidden_, workspace_ and the logits buffers for a step of this size (grown,
  // never shrunk; forward grows them on demand). A caller that bounds its
  // steps reserves them up front (model/draft_model.h), so they are allocated
  // once and measurable.
  void reserve_step_buffers(int64_t n_tokens, int64_t n_logits);

 private:
  CausalLM(const ModelSpec& spec, const Layout& layout, int tp_rank, int pp_rank, Communicator& tp, Communicator& pp,
           std::shared_ptr<backend::Backend> backend);
  void load_weights(std::shared_ptr<const WeightSource> weights);
  // meta_ for batch, then n_padding padding rows.
  void pack_step(const ForwardBatch& batch, const KvCache& cache, int64_t n_padding);
  // This stage's layers over hidden [meta_.n_tokens(), hidden].
  void run_layers(Tensor& hidden, KvCache& cache);
  // Last stage: out [meta_.n_logits(), vocab] from hidden's logit rows.
  void make_logits(const Tensor& hidden, Tensor& out);
  // A qualifying decode step through graphs_; false (nothing done) when it does not qualify.
  bool run_graph_step(const ForwardBatch& batch, KvCache& cache, float* logits);
  // The graph runner's step: the ops of meta_ (padded to n_rows) into logits_out_.
  void enqueue_graph_step(int n_rows);

  ModelSpec spec_;
  Layout layout_;
  RankShard shard_;
  const DecoderFamily& family_;
  Communicator& tp_;
  Communicator& pp_;
  std::shared_ptr<backend::Backend> backend_;
  std::shared_ptr<const WeightSource> weights_;  // keeps the mapping alive for the views
  int64_t weight_bytes_ = 0;
  int64_t copied_bytes_ = 0;
  RankDims dims_;
  Tensor inv_freq_;                            // [rotary_dim / 2] f32; LongRoPE: [2, rotary_dim / 2], short then long
  int64_t long_rope_from_ = 0;                 // LongRoPE: original_max_position_embeddings; 0 for other ropes
  Tensor inv_freq_local_;                      // [head_dim / 2] f32 of local layers (Gemma 3); undefined otherwise
  float embed_scale_ = 1.0f;                   // Gemma: sqrt(hidden) in the checkpoint dtype
  std::vector<DecoderLayerWeights> layers_;    // this stage's layers, in order
  Tensor embed_;                               // [vocab_local, hidden] (first stage)
  Linear lm_head_;                             // [vocab_local, hidden] (last stage; quantized for GPTQ lm_head)
  Tensor final_norm_;                          // [hidden] (last stage)
  std::vector<Range> vocab_ranges_;            // per TP rank
  // Per-step state, reused: grown when a step is larger than any before.
  backend::StepMetadata meta_;
  Workspace workspace_;
  Tensor hidden_;                              // [capacity, hidden]
  Tensor last_hidden_;                         // [n_logits capacity, hidden]
  Tensor logits_local_, logits_gathered_, logits_out_;  // [n_logits capacity, vocab_local / vocab / vocab]
  int64_t hidden_capacity_ = 0, logits_capacity_ = 0;
  TensorDump* dump_ = nullptr;                 // dump_tensors
  std::unique_ptr<backend::DecodeGraphs> graphs_;  // enable_decode_graphs; null: every step eager
  KvCache* graph_kv_ = nullptr;                    // the cache of the graph step being run
};

}  // namespace shardlm
