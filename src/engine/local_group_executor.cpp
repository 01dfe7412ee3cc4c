#include "engine/local_group_executor.h"

#include <algorithm>

#include "backend/ops.h"
#include "comm/local_comm.h"
#include "core/error.h"
#include "model/causal_lm.h"

namespace shardlm {

namespace {
struct World {
  std::vector<std::unique_ptr<LocalComm>> comms;
};
}  // namespace

LocalGroupExecutor::LocalGroupExecutor(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                       const LocalGroupOptions& options)
    : spec_(spec), weights_(std::move(weights)), options_(options),
      n_ranks_(options.layout.tp * options.layout.pp), vocab_size_(spec.vocab_size) {
  if (options.layout.dp != 1)
    fail(ErrorCode::kInvalidArgument, "an executor runs one replica: DP must be 1 here, got ", options.layout.dp);
  if (options.n_blocks < 1) fail(ErrorCode::kInvalidArgument, "executor: n_blocks must be >= 1, got ", options.n_blocks);
  validate_layout(spec_, options.layout);
  rank_memory_.resize(n_ranks_);
  auto world = std::make_shared<World>();
  world->comms = LocalComm::create_world(n_ranks_);
  world_ = world;
  for (int r = 0; r < n_ranks_; ++r) threads_.emplace_back([this, r] { run_rank(r); });
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return n_loaded_ == n_ranks_ || broken_; });
  if (broken_) {
    shutdown_ = true;
    cv_.notify_all();
    lock.unlock();
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::rethrow_exception(error_);
  }
}

LocalGroupExecutor::~LocalGroupExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void LocalGroupExecutor::run_rank(int rank) {
  auto& world = *static_cast<World*>(world_.get());
  Communicator& comm = *world.comms[rank];
  const Layout& layout = options_.layout;
  bool loaded = false;
  try {
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    backend::set_num_threads(options_.n_threads_per_rank > 0 ? options_.n_threads_per_rank
                                                            : std::max(1, int(hw) / n_ranks_));
    RankComms comms = split_rank_comms(comm, layout);
    const int tp_rank = rank % layout.tp, pp_rank = rank / layout.tp;
    auto model = CausalLM::load(spec_, weights_, layout, tp_rank, pp_rank, *comms.tp, *comms.pp);
    KvCache cache = model->make_kv_cache(options_.n_blocks, options_.block_size, options_.kv_dtype);
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (rank == 0) kv_block_bytes_rank0_ = model->kv_block_bytes(options_.block_size, options_.kv_dtype);
      rank_memory_[rank] = RankMemory{tp_rank, pp_rank, model->weight_bytes(), cache.bytes()};
      ++n_loaded_;
      loaded = true;
    }
    cv_.notify_all();
    for (;;) {
      const ForwardBatch* batch = nullptr;
      float* logits = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return shutdown_ || generation_ != seen; });
        if (shutdown_) return;
        seen = generation_;
        batch = batch_;
        logits = logits_;
      }
      model->forward(*batch, cache, model->is_driver() ? logits : nullptr);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++n_done_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    comm.abort("a rank of the local group failed");  // peers blocked in a collective stop too
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
    broken_ = true;
    if (loaded) ++n_done_;
    cv_.notify_all();
  }
}

void LocalGroupExecutor::execute(const ForwardBatch& batch, float* logits) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (broken_) fail(ErrorCode::kDistributed, "the model's rank group failed earlier and cannot run more steps");
  batch_ = &batch;
  logits_ = logits;
  n_done_ = 0;
  ++generation_;
  cv_.notify_all();
  // A failed rank counts as done (its peers are released from their
  // collectives by the world abort and count as done too).
  cv_.wait(lock, [&] { return n_done_ == n_ranks_; });
  if (broken_) std::rethrow_exception(error_);
}

}  // namespace shardlm
