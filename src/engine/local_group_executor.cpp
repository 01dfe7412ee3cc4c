#include "engine/local_group_executor.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "backend/backend.h"
#include "comm/local_comm.h"
#include "core/error.h"
#include "model/causal_lm.h"
#include "model/rank_group.h"

namespace shardlm {

namespace {
struct World {
  std::vector<std::unique_ptr<LocalComm>> comms;
  std::unique_ptr<RankGroupFactory> ranks;
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
  start_ranks();
}

void LocalGroupExecutor::start_ranks() {
  auto world = std::make_shared<World>();
  world->comms = LocalComm::create_world(n_ranks_);
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  world->ranks = std::make_unique<RankGroupFactory>(
      options_.layout, options_.device,
      options_.n_threads_per_rank > 0 ? options_.n_threads_per_rank : std::max(1, int(hw) / n_ranks_),
      options_.batch_invariant);
  world_ = world;
  for (int r = 0; r < n_ranks_; ++r) threads_.emplace_back([this, r] { run_rank(r); });
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return n_loaded_ == n_ranks_ || broken_; });
  if (broken_) {
    lock.unlock();
    stop_ranks();
    std::rethrow_exception(error_);
  }
}

void LocalGroupExecutor::stop_ranks() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool LocalGroupExecutor::healthy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !broken_;
}

bool LocalGroupExecutor::restart() {
  stop_ranks();  // the failed rank has exited; its peers leave their wait or aborted collective
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.clear();
    n_submitted_ = 0;
    n_loaded_ = 0;
    shutdown_ = false;
    broken_ = false;
    error_ = nullptr;
  }
  start_ranks();
  return true;
}

LocalGroupExecutor::~LocalGroupExecutor() {
  {
    // Uncollected batches run to their end first: a stage that stopped early
    // would leave the next stage waiting for its hidden states.
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] {
      return broken_ || std::all_of(jobs_.begin(), jobs_.end(), [&](const auto& j) { return j->n_done == n_ranks_; });
    });
  }
  stop_ranks();
}

void LocalGroupExecutor::run_rank(int rank) {
  std::shared_ptr<void> world_holder;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    world_holder = world_;
  }
  auto& world = *static_cast<World*>(world_holder.get());
  Communicator& comm = *world.comms[rank];
  const Layout& layout = options_.layout;
  const int tp_rank = rank % layout.tp, pp_rank = rank / layout.tp;
  std::optional<RankContext> ctx;
  try {
    ctx.emplace(world.ranks->make(comm));
    RankComms& comms = ctx->comms;
    auto model = CausalLM::load(spec_, weights_, layout, tp_rank, pp_rank, *comms.tp, *comms.pp, ctx->backend);
    KvCache cache =
        model->make_kv_cache(options_.n_blocks, options_.block_size, options_.kv_dtype, options_.n_local_blocks);
    const std::string graphs = options_.graphs.enabled ? model->enable_decode_graphs(options_.graphs) : "";
    const backend::DecodeGraphs* dg = rank == 0 ? model->decode_graphs() : nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (rank == 0) {
        kv_block_bytes_rank0_ = model->kv_block_bytes(options_.block_size, options_.kv_dtype);
        graph_status_ = graphs;
        n_graph_replays_ = 0;
      }
      rank_memory_[rank] = RankMemory{tp_rank, pp_rank, model->weight_bytes(), cache.bytes()};
      ++n_loaded_;
    }
    cv_.notify_all();
    // The last stage's tp 0 writes the logits straight into the job.
    const bool writes_logits = tp_rank == 0 && pp_rank == layout.pp - 1;
    for (uint64_t next = 0;; ++next) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return shutdown_ || n_submitted_ > next; });
        if (shutdown_) return;
        // Uncollected jobs stay in jobs_ until every rank is done with them.
        job = jobs_[static_cast<size_t>(next - jobs_.front()->index)];
        for (const auto& earlier : jobs_) {
          if (earlier->index >= next) break;
          if (earlier->n_done < n_ranks_) {
            ++n_overlapped_starts_;
            break;
          }
        }
        ++job->n_started;
        if (rank == options_.fail_rank && static_cast<int64_t>(next) == options_.fail_at_batch && fault_armed_) {
          fault_armed_ = false;
          fail(ErrorCode::kInternal, "injected failure at batch ", next, " (test hook)");
        }
      }
      if (options_.batch_hook) options_.batch_hook(rank, next, false);
      model->run_stage(job->batch, cache, writes_logits ? job->logits.data() : nullptr);
      if (options_.batch_hook) options_.batch_hook(rank, next, true);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++job->n_done;
        if (dg) n_graph_replays_ = dg->cache().n_replays();
      }
      cv_.notify_all();
    }
  } catch (...) {
    // The first failure names its rank; its peers' errors (the abort below
    // wakes them from their collectives) are consequences.
    std::string what = "unknown exception";
    try {
      throw;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_)
        error_ = std::make_exception_ptr(Error(ErrorCode::kDistributed, str_cat("rank ", rank, " (tp ", tp_rank, ", pp ",
                                                                                pp_rank, ") failed: ", what)));
      broken_ = true;
    }
    // Peers blocked in a collective stop too: the TP and PP groups are
    // worlds of their own, so each is aborted (a peer that fails in turn
    // aborts its groups, and so on).
    if (ctx) ctx->abort("a rank of the local group failed");
    comm.abort("a rank of the local group failed");
    cv_.notify_all();
  }
}

void LocalGroupExecutor::submit(ForwardBatch batch) {
  auto job = std::make_shared<Job>();
  std::lock_guard<std::mutex> lock(mutex_);
  // A collected batch's buffer, reused: no vocab-sized allocation or zero
  // fill per step (the last stage writes every row it is given).
  if (!spare_logits_.empty()) {
    job->logits = std::move(spare_logits_.back());
    spare_logits_.pop_back();
  }
  job->logits.resize(static_cast<size_t>(batch.n_logits() * vocab_size_));
  job->batch = std::move(batch);
  if (broken_) fail(ErrorCode::kDistributed, "the model's rank group failed earlier and cannot run more steps");
  SHARDLM_CHECK(static_cast<int>(jobs_.size()) < max_in_flight(), "submit beyond max_in_flight (", max_in_flight(), ")");
  job->index = n_submitted_++;
  jobs_.push_back(std::move(job));
  cv_.notify_all();
}

std::shared_ptr<LocalGroupExecutor::Job> LocalGroupExecutor::wait_oldest(std::unique_lock<std::mutex>& lock) {
  SHARDLM_CHECK(!jobs_.empty(), "collect with no batch submitted");
  // A failed rank aborts the world, so its peers fail too instead of waiting.
  cv_.wait(lock, [&] { return broken_ || jobs_.front()->n_done == n_ranks_; });
  if (broken_) std::rethrow_exception(error_);
  std::shared_ptr<Job> job = std::move(jobs_.front());
  jobs_.pop_front();
  return job;
}

void LocalGroupExecutor::collect(float* logits) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<Job> job = wait_oldest(lock);
  lock.unlock();
  std::copy(job->logits.begin(), job->logits.end(), logits);
  lock.lock();
  if (static_cast<int>(spare_logits_.size()) < max_in_flight()) spare_logits_.push_back(std::move(job->logits));
}

void LocalGroupExecutor::collect_into(std::vector<float>& logits, int64_t n_logits) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::shared_ptr<Job> job = wait_oldest(lock);
  check_logit_rows(job->logits.size(), n_logits, vocab_size_);
  std::swap(logits, job->logits);
  if (static_cast<int>(spare_logits_.size()) < max_in_flight()) spare_logits_.push_back(std::move(job->logits));
}

void LocalGroupExecutor::execute(const ForwardBatch& batch, float* logits) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    SHARDLM_CHECK(jobs_.empty(), "execute with batches in flight; collect them first");
  }
  submit(batch);
  collect(logits);
}

std::string LocalGroupExecutor::graph_status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return graph_status_;
}

int64_t LocalGroupExecutor::n_graph_replays() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return n_graph_replays_;
}

int64_t LocalGroupExecutor::n_overlapped_starts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return n_overlapped_starts_;
}

}  // namespace shardlm
