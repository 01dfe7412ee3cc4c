// The ModelExecutor for one replica whose TP x PP ranks are processes
// (OpenMPI, on one host or several, started by mpirun). Every process of the
// world constructs one: the world splits into DP replicas of tp x pp ranks
// (WorldConfig numbering: tp fastest, then pp, then dp), each rank loads only
// its own shard from the model directory, and the ranks report their weight
// and KV bytes to the replica's driver (tp 0, pp 0).
//
// The driver hands each ForwardBatch to submit() (or execute()): it is
// encoded (see encode_forward_batch) and broadcast over stage 0's TP group;
// every rank passes the message on to the same tp rank of the next stage
// ahead of the hidden states, so each stage learns of batch k when its input
// arrives and is free to run batch k+1 meanwhile: up to PP batches are in
// flight. The last stage's tp 0 sends the logits back to the driver, which
// receives them at collect(). Every pipeline send is asynchronous, so the
// ring of stages cannot deadlock. The other ranks sit in run_worker() until
// the driver's shutdown() (or its destructor) sends the end the same way. A rank that throws calls Communicator::abort, which with MPI is
// MPI_Abort: mpirun stops every process and names the failed one.
//
// Only Communicator is used, so the same executor also runs over LocalComm
// threads (tests do that); with MPI the world is make_mpi_world_comm().
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "engine/model_executor.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "model/generate.h"
#include "model/kv_cache.h"
#include "plan/sharding.h"

namespace shardlm {

struct MpiGroupOptions {
  std::filesystem::path model_dir;  // config.json + *.safetensors: the same path on every host
  Layout layout;                    // tp x pp x dp == world size
  // KV geometry; the driver's values are broadcast to its replica, so the
  // workers' are ignored (serve's workers do not size the cache).
  int64_t n_blocks = 0;             // KV blocks per rank: must equal SchedulerConfig::n_blocks
  int64_t block_size = 16;          // must equal SchedulerConfig::block_size
  int64_t n_local_blocks = 0;       // the sliding-window layers' own pool (SchedulerConfig::n_local_blocks); 0: none
  DType kv_dtype = DType::kBF16;
  int n_threads_per_rank = 0;       // backend threads; 0: hardware threads / ranks on this host
  bool batch_invariant = false;     // --batch-invariant; the driver's value is broadcast to its replica
  // cpu, or this process's GPU (one per process: cli/device_flag.h). On a GPU
  // the model's collectives go over NCCL communicators made from the MPI
  // world (unique id broadcast over MPI), on the backend's stream; the
  // driver's control messages stay on MPI.
  Device device;
};

// What one rank of a replica holds, as reported to the driver.
struct RankBytes {
  int world_rank = 0;
  int tp_rank = 0;
  int pp_rank = 0;
  int64_t weight_bytes = 0;  // CausalLM::weight_bytes
  int64_t kv_bytes = 0;      // KvCache::bytes(): measured by the rank's allocator
};

class MpiGroupExecutor final : public ModelExecutor {
 public:
  // Collective over `world` (every rank calls it; world must outlive the
  // executor). Throws kInvalidArgument when world.size() != layout's world
  // size or the layout does not fit the model (the same on every rank, so
  // every rank throws). A rank whose load fails aborts the world.
  MpiGroupExecutor(Communicator& world, const MpiGroupOptions& options);
  ~MpiGroupExecutor() override;  // the driver broadcasts shutdown if it has not

  int64_t vocab_size() const override { return vocab_size_; }
  // Driver only. logits: [batch.n_logits(), vocab_size()].
  void execute(const ForwardBatch& batch, float* logits) override;
  int max_in_flight() const override { return options_.layout.pp; }
  void submit(ForwardBatch batch) override;  // driver only
  void collect(float* logits) override;      // driver only
  void collect_into(std::vector<float>& logits, int64_t n_logits) override;  // driver only; PP = 1: no copy
  int64_t n_kv_blocks() const override { return options_.n_blocks; }
  int64_t n_local_kv_blocks() const override { return options_.n_local_blocks; }
  int64_t kv_block_size() const override { return options_.block_size; }
  bool healthy() const override { return !aborted_; }
  // Non-driver ranks: run every batch the driver broadcasts; returns after
  // its shutdown.
  void run_worker();
  // Driver only: releases the workers of this replica. Idempotent.
  void shutdown();

  bool is_driver() const { return replica_->rank() == 0; }
  int replica_index() const { return dp_rank_; }
  const WorldConfig& world_config() const { return world_config_; }
  const CausalLM& model() const { return *model_; }
  // Driver: one entry per rank of its replica, in replica rank order
  // (tp fastest). Elsewhere: only this rank's entry.
  const std::vector<RankBytes>& rank_bytes() const { return rank_bytes_; }
  int64_t kv_block_bytes() const { return model_->kv_block_bytes(options_.block_size, options_.kv_dtype); }

 private:
  // Stage 0 receives the driver's message over its TP group; later stages
  // from the previous stage. Either way it is passed on to the next stage.
  void pass_message(std::vector<int32_t>& message);
  // GPU ranks: NCCL world, replica and tp/pp groups, bound to the backend's stream.
  void make_device_comms(backend::Backend& rank_backend, int world_rank);
  [[noreturn]] void abort_world(const char* where, const std::exception& e);

  // A batch the driver submitted and has not collected.
  struct InFlight {
    ForwardBatch batch;
    std::vector<float> logits;  // PP = 1: the logits, made at submit
  };

  Communicator& world_;
  MpiGroupOptions options_;
  WorldConfig world_config_;
  int dp_rank_ = 0;
  int64_t vocab_size_ = 0;
  std::unique_ptr<Communicator> replica_;
  RankComms comms_;  // MPI: the driver's messages (host memory)
  // GPU ranks: NCCL over the same ranks, for the model's tensors (device memory).
  std::unique_ptr<Communicator> device_world_, device_replica_;
  RankComms device_comms_;
  std::unique_ptr<CausalLM> model_;
  KvCache cache_;
  std::vector<RankBytes> rank_bytes_;
  ForwardBatch batch_;  // the decoded batch (workers)
  std::deque<InFlight> in_flight_;  // driver
  std::vector<float> spare_logits_;  // driver, PP = 1: a collected batch's buffer, for the next submit
  bool shut_down_ = false;
  bool aborted_ = false;  // abort_world ran: the replica cannot run again (no restart across processes)
};

// The wire format of one message from the driver, all int32 little-endian:
//   [kind, n_seqs, n_tokens, token_ids[n_tokens],
//    per seq: n_tokens, n_past, logits flags (1: need_logits, 2: all_logits, 4: long_context), n_blocks,
//             block_table[n_blocks], n_local, local_block_table[n_local]]
// kind 0 = shutdown (nothing follows), 1 = batch.
std::vector<int32_t> encode_forward_batch(const ForwardBatch& batch);
std::vector<int32_t> encode_shutdown();
// Returns false for shutdown. Throws kCorruptFile when the message is
// inconsistent (sizes that do not add up).
bool decode_forward_batch(const std::vector<int32_t>& message, ForwardBatch* batch);

// One line per rank: "rank 1 (tp 1, pp 0): weights N bytes, kv M bytes".
std::string describe_rank_bytes(const std::vector<RankBytes>& ranks);

// `shardlm generate` over the processes of `world` (one replica, dp = 1):
// every rank calls it; the driver (world rank 0) runs the token loop through
// an MpiGroupExecutor and gets the result, the others serve as workers and
// get an empty result. weight_bytes_rank0 and *rank_bytes (when given) are
// set on the driver.
GenerateResult generate_mpi(Communicator& world, const std::filesystem::path& model_dir,
                            const std::vector<int32_t>& prompt, const GenerateOptions& options,
                            std::vector<RankBytes>* rank_bytes = nullptr);

}  // namespace shardlm
