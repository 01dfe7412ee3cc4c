// What the engine needs from a model: run one ForwardBatch (on every rank
// behind it) and return the logits of the tokens that asked for them. The
// executor owns the KV tensors, sized for the engine's n_blocks x block_size;
// the engine owns which block holds which positions.
#pragma once

#include <cstdint>

#include "model/forward_batch.h"

namespace shardlm {

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual int64_t vocab_size() const = 0;
  // logits: [batch.n_logits(), vocab_size()] row-major, one row per sequence
  // with need_logits, in batch.seqs order. Throws shardlm::Error on failure.
  virtual void execute(const ForwardBatch& batch, float* logits) = 0;
  // KV geometry the executor allocated, checked against the engine's
  // SchedulerConfig at construction; 0 = not known (fakes).
  virtual int64_t n_kv_blocks() const { return 0; }
  virtual int64_t kv_block_size() const { return 0; }
};

}  // namespace shardlm
