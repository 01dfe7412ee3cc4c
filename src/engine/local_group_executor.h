// The real-model ModelExecutor for one replica whose TP x PP ranks are
// threads of this process (LocalComm): each rank thread loads its CausalLM
// slice and its KV cache once, then runs every ForwardBatch the engine hands
// over, in submission order; the last stage's tp 0 writes the logits. With
// PP > 1 up to PP batches are in flight: each rank thread moves on to the
// next batch as soon as its stage is done with the current one, so stage 0
// runs batch k+1 while stage 1 runs batch k. TP = PP = 1 is the plain
// single-device case.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/device/decode_graphs.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "engine/model_executor.h"
#include "loader/model_spec.h"
#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

struct LocalGroupOptions {
  Layout layout;                   // tp x pp ranks (dp must be 1)
  int64_t n_blocks = 0;            // KV blocks per rank: must equal SchedulerConfig::n_blocks
  int64_t block_size = 16;         // must equal SchedulerConfig::block_size
  // > 0 (hybrid models, Gemma 3): the sliding-window layers' own pool of
  // blocks per rank; must equal SchedulerConfig::n_local_blocks. 0: every
  // layer in the n_blocks pool.
  int64_t n_local_blocks = 0;
  DType kv_dtype = DType::kBF16;
  int n_threads_per_rank = 0;      // backend threads; 0: hardware threads / ranks
  // Every rank's backend on its batch-invariant kernels (--batch-invariant):
  // a sequence's logits do not depend on the rest of its step. Refused
  // (kUnsupported, at load) by a backend without them.
  bool batch_invariant = false;
  Device device;                   // cpu, or the GPU every rank (thread) shares (model/rank_group.h)
  // Decode steps through CUDA graphs (CausalLM::enable_decode_graphs): set
  // enabled, max_batch and max_context (the engine's max_model_len).
  backend::DecodeGraphOptions graphs;
  // Test hook: rank `fail_rank` throws when it reaches batch `fail_at_batch`
  // (0-based, counted from load), once: a restarted group runs clean.
  int fail_rank = -1;
  int64_t fail_at_batch = -1;
  // Test hook, on each rank's thread: (rank, batch, false) once the rank has
  // taken batch `batch` (its start counted), (rank, batch, true) once it has
  // run its part and before it reports the part done. A test holds a rank
  // here to make an interleaving certain instead of likely.
  std::function<void(int rank, uint64_t batch, bool ran)> batch_hook;
};

class LocalGroupExecutor final : public ModelExecutor {
 public:
  // Loads every rank (blocks until done). Throws what a rank's load threw
  // (missing tensor, bad layout) as shardlm::Error.
  LocalGroupExecutor(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                     const LocalGroupOptions& options);
  ~LocalGroupExecutor() override;

  int64_t vocab_size() const override { return vocab_size_; }
  void execute(const ForwardBatch& batch, float* logits) override;
  int max_in_flight() const override { return options_.layout.pp; }
  void submit(ForwardBatch batch) override;
  void collect(float* logits) override;
  void collect_into(std::vector<float>& logits, int64_t n_logits) override;  // no copy: the job's buffer
  int64_t n_kv_blocks() const override { return options_.n_blocks; }
  int64_t n_local_kv_blocks() const override { return options_.n_local_blocks; }
  int64_t kv_block_size() const override { return options_.block_size; }
  // A rank failed (its error names it): nothing runs until restart().
  bool healthy() const override;
  // Stops every rank thread, drops the batches in flight, and loads the
  // ranks again (fresh KV cache). Throws what a rank's load threw.
  bool restart() override;

  // Bytes one KV block takes on rank 0 (what the block pool divides by).
  int64_t kv_block_bytes_rank0() const { return kv_block_bytes_rank0_; }
  // Rank 0's "CUDA graphs: ..." line from its load ("" when graphs were not asked for).
  std::string graph_status() const;
  // Decode steps rank 0 replayed from a graph so far.
  int64_t n_graph_replays() const;

  // What each rank holds once loaded, in rank order (tp fastest): the
  // startup log prints these beside plan's prediction.
  struct RankMemory {
    int tp_rank = 0;
    int pp_rank = 0;
    int64_t weight_bytes = 0;    // checkpoint views + column-slice copies
    int64_t kv_cache_bytes = 0;  // K + V blocks allocated
  };
  const std::vector<RankMemory>& rank_memory() const { return rank_memory_; }

  // Times a rank started a batch while an earlier batch was still running on
  // another rank: the pipeline overlap that micro-batches buy (0 with PP = 1).
  int64_t n_overlapped_starts() const;

 private:
  void run_rank(int rank);
  void start_ranks();  // spawns the rank threads; blocks until loaded (throws a load error)
  void stop_ranks();   // shutdown_ + join

  ModelSpec spec_;
  std::shared_ptr<const WeightSource> weights_;
  LocalGroupOptions options_;
  int n_ranks_;
  int64_t vocab_size_;
  int64_t kv_block_bytes_rank0_ = 0;
  std::string graph_status_;
  int64_t n_graph_replays_ = 0;  // rank 0's count, copied after each of its steps (under mutex_)
  std::vector<RankMemory> rank_memory_;

  // A submitted batch; every rank runs it once, in index order.
  struct Job {
    uint64_t index = 0;
    ForwardBatch batch;
    std::vector<float> logits;  // [n_logits, vocab]: written by the last stage's tp 0
    int n_started = 0;
    int n_done = 0;
  };
  // Waits (lock held) until every rank finished the oldest job, and takes it
  // off jobs_; rethrows a rank's failure.
  std::shared_ptr<Job> wait_oldest(std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::vector<float>> spare_logits_;  // collected jobs' logits buffers, for the next submits
  std::vector<std::thread> threads_;
  std::shared_ptr<void> world_;      // keeps the LocalComm world alive
  int n_loaded_ = 0;
  std::deque<std::shared_ptr<Job>> jobs_;  // submitted, not collected; oldest first
  uint64_t n_submitted_ = 0;
  int64_t n_overlapped_starts_ = 0;
  bool shutdown_ = false;
  bool broken_ = false;              // a rank failed: nothing runs until restart()
  bool fault_armed_ = true;          // the test hook fires once
  std::exception_ptr error_;
};

}  // namespace shardlm
