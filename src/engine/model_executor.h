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
};

}  // namespace shardlm
