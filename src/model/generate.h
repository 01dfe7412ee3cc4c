// Token-by-token generation for one request on a TP × PP group whose ranks
// are threads of this process (LocalComm): `shardlm generate`, tests, bench.
// The driver (tp 0, pp 0) picks each next token from the logits and
// broadcasts it, so every rank runs the same ForwardBatch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device/decode_graphs.h"
#include "comm/communicator.h"
#include "model/forward_batch.h"
#include "model/speculative.h"
#include "model/tensor_dump.h"
#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

struct GenerateOptions {
  Layout layout;
  Device device;                       // cpu, or the GPU every rank (thread) shares (model/rank_group.h)
  int64_t max_tokens = 16;
  std::vector<int64_t> eos_token_ids;  // stop when one is produced (it is kept in the output)
  DType kv_dtype = DType::kF32;
  int64_t block_size = 16;
  int64_t prefill_chunk = 0;  // > 0: prefill the prompt in chunks of this many tokens
  bool batch_invariant = false;  // every rank's backend on its batch-invariant kernels (--batch-invariant)
  // --speculative-config ngram (model/speculative.h); implies batch_invariant,
  // which verification needs. pick must be a stateful sampler (one call per
  // produced token, in order): verification calls it row by row and stops at
  // the first token that differs from its draft, which at temperature > 0 is
  // rejection sampling with a one-hot draft (sampling/speculative_sampling.h).
  SpeculativeOptions speculative;
  // Intermediates to record by name (model/tensor_dump.h: "q", "ffn_moe_topk",
  // "all", ...) on the driver's layers, for every token fed (prompt, then each
  // generated token but the last), into GenerateResult::tensors. Needs pp == 1
  // (the driver runs every layer); kInvalidArgument otherwise.
  std::vector<std::string> dump_tensors;
  // Decode steps through CUDA graphs (CausalLM::enable_decode_graphs); its
  // max_context is filled in from the prompt and max_tokens.
  backend::DecodeGraphOptions graphs;
  // Sample on the device (Backend::sample_rows) with these parameters instead
  // of pick: only the token id crosses per step. TP = PP = 1 and a backend
  // with a device sampler (kUnsupported otherwise); prompt_logits stay empty.
  bool device_sampling = false;
  backend::DeviceSampleRow device_row;
  // LongRoPE: rotate every position with the long factors
  // (SequenceChunk::long_context). generate sets it from the prompt
  // (ModelSpec::long_context); perplexity from each window, as transformers'
  // one forward over the window would.
  bool long_context = false;
  // speculative.uses_draft_model(): the driver's draft (model/draft_model.h),
  // up to max_draft tokens after context; the other ranks get its tokens by
  // broadcast. generate_local / generate_mpi set it from speculative.draft_model.
  std::function<std::vector<int32_t>(std::span<const int32_t> context, int64_t max_draft)> draft;
  // Picks the next token from logits [vocab_size] on the driver; nullptr = greedy.
  std::function<int32_t(const float* logits, int64_t vocab_size, const std::vector<int32_t>& generated)> pick;
};

struct GenerateResult {
  std::vector<int32_t> tokens;        // generated ids
  std::string finish_reason;          // "length" or "stop"
  std::vector<float> prompt_logits;   // [vocab_size]: the last prompt position (produced tokens[0])
  std::vector<std::vector<float>> step_logits;  // [n_generated][vocab_size] when keep_all_logits
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;        // all steps after the first token
  int64_t weight_bytes_rank0 = 0;     // bytes held by the driver rank
  // dump_tensors: what the driver recorded, in the order computed (one entry per (name, layer) per step).
  std::vector<DumpedTensor> tensors;
  std::string graphs;                 // the driver's "CUDA graphs: ..." line ("" when not asked for)
  int64_t graph_replays = 0;          // decode steps the driver replayed from a graph
  SpeculativeStats speculative;       // drafts, drafted and accepted tokens (speculative.enabled())
  int64_t draft_weight_bytes = 0;     // a draft model's, on the driver (measured, beside weight_bytes_rank0)
  int64_t draft_kv_bytes = 0;
};

// Greedy with the lowest id on ties.
int32_t argmax_token(const float* logits, int64_t vocab_size);

// Runs one step of the group: logits [batch.n_logits(), vocab] written on the driver.
using GenerateStep = std::function<void(const ForwardBatch& batch, float* logits)>;

// The token loop of one request, shared by the thread and MPI paths.
// step runs a batch on the whole group. group == nullptr: only the driver runs
// the loop (step reaches the other ranks itself, as an executor does); else
// every rank of `group` runs it and the driver's token is broadcast over it.
// The result (tokens, logits, timings) is filled on the driver.
GenerateResult generate_steps(const GenerateStep& step, int64_t vocab_size, int64_t kv_blocks,
                              const std::vector<int32_t>& prompt, const GenerateOptions& options, bool keep_all_logits,
                              Communicator* group, bool is_driver);
// KV blocks one request of prompt + max_tokens needs.
int64_t generate_kv_blocks(const std::vector<int32_t>& prompt, const GenerateOptions& options);
// Checks prompt, max_tokens and the layout (dp must be 1); throws kInvalidArgument.
void validate_generate(const ModelSpec& spec, const std::vector<int32_t>& prompt, const GenerateOptions& options);

GenerateResult generate_local(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                              const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              bool keep_all_logits = false);

}  // namespace shardlm
