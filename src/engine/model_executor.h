// What the engine needs from a model: run ForwardBatches (on every rank
// behind it) and return the logits of the tokens that asked for them. The
// executor owns the KV tensors, sized for the engine's n_blocks x block_size;
// the engine owns which block holds which positions.
//
// Two ways to drive it. execute: one batch, synchronously. submit/collect: a
// pipeline of PP stages keeps up to max_in_flight() batches moving at once
// (stage 0 runs batch k+1 while stage 1 runs batch k); the engine submits
// batches of disjoint sequences and collects them oldest first. Batches run
// in submission order on every rank, so a later batch sees the KV an earlier
// one wrote.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "core/error.h"
#include "model/forward_batch.h"

namespace shardlm {

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual int64_t vocab_size() const = 0;
  // logits: [batch.n_logits(), vocab_size()] row-major, one row per sequence
  // with need_logits, in batch.seqs order, every entry written (the engine
  // does not clear the buffer between steps). Throws shardlm::Error on failure.
  // Only with nothing in flight.
  virtual void execute(const ForwardBatch& batch, float* logits) = 0;

  // How many submitted batches may wait uncollected: the pipeline depth.
  virtual int max_in_flight() const { return 1; }
  // Starts `batch`. At most max_in_flight() uncollected batches.
  // The default keeps it and runs it at collect.
  virtual void submit(ForwardBatch batch) {
    SHARDLM_CHECK(static_cast<int>(pending_.size()) < max_in_flight(), "submit beyond max_in_flight (",
                  max_in_flight(), ")");
    pending_.push_back(std::move(batch));
  }
  // Waits for the oldest submitted batch and writes its logits
  // ([n_logits, vocab_size()]). Throws what running it threw.
  virtual void collect(float* logits) {
    SHARDLM_CHECK(!pending_.empty(), "collect with no batch submitted");
    ForwardBatch batch = std::move(pending_.front());
    pending_.pop_front();
    execute(batch, logits);
  }
  // collect(), leaving the logits in `logits` (resized to [n_logits,
  // vocab_size()]). An executor whose ranks wrote them into a buffer of its
  // own hands that buffer over and keeps the vector's old storage as its
  // next spare: 16 decode rows of a 152K vocabulary are 9.7 MB a step not
  // copied. The default collects into the vector.
  virtual void collect_into(std::vector<float>& logits, int64_t n_logits) {
    logits.resize(static_cast<size_t>(n_logits * vocab_size()));
    collect(logits.data());
  }

  // KV geometry the executor allocated, checked against the engine's
  // SchedulerConfig at construction; 0 = not known (fakes).
  virtual int64_t n_kv_blocks() const { return 0; }
  // The local (sliding-window) layers' own pool (SchedulerConfig::n_local_blocks); 0: none.
  virtual int64_t n_local_kv_blocks() const { return 0; }
  virtual int64_t kv_block_size() const { return 0; }

  // False once a failure broke the executor for good (a rank died): every
  // later submit would fail. A transient failure (one batch threw) keeps it
  // healthy. The engine thread asks after a submit or collect threw.
  virtual bool healthy() const { return true; }
  // Rebuilds a broken executor in place (ranks reloaded, KV cache empty,
  // nothing in flight). Returns false when this executor cannot restart
  // (its ranks are other processes); throws shardlm::Error when it tried and
  // failed. Engine thread only, with nothing the engine still waits for.
  virtual bool restart() { return false; }

 protected:
  // collect_into's check that a batch's buffer holds the rows the caller expects.
  static void check_logit_rows(size_t n_floats, int64_t n_logits, int64_t vocab) {
    SHARDLM_CHECK(static_cast<int64_t>(n_floats) == n_logits * vocab, "collect_into: the batch has ",
                  n_floats / static_cast<size_t>(vocab), " logit rows, the caller expects ", n_logits);
  }
  // For restart() of an executor using the default submit/collect.
  void drop_pending() { pending_.clear(); }

 private:
  std::deque<ForwardBatch> pending_;  // the default submit/collect
};

}  // namespace shardlm
