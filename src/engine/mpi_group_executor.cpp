#include "engine/mpi_group_executor.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "backend/cpu/bf16_dot_gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_ops.h"
#include "core/error.h"
#include "loader/model_spec.h"
#include "model/draft_model.h"
#include "model/generate.h"
#if defined(SHARDLM_HAVE_NCCL)
#include "backend/cuda/cuda_backend.h"
#include "comm/nccl/nccl_comm.h"
#endif

namespace shardlm {

namespace {

enum : int32_t { kMsgShutdown = 0, kMsgBatch = 1 };

// Ranks sharing this host: mpirun says; else assume all ranks of the replica.
int local_ranks(int fallback) {
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return fallback;
}

}  // namespace

std::vector<int32_t> encode_forward_batch(const ForwardBatch& batch) {
  std::vector<int32_t> m;
  size_t n = 3 + batch.token_ids.size();
  for (const auto& s : batch.seqs) n += 5 + s.block_table.size() + s.local_block_table.size();
  m.reserve(n);
  m.push_back(kMsgBatch);
  m.push_back(static_cast<int32_t>(batch.seqs.size()));
  m.push_back(static_cast<int32_t>(batch.token_ids.size()));
  m.insert(m.end(), batch.token_ids.begin(), batch.token_ids.end());
  for (const auto& s : batch.seqs) {
    m.push_back(s.n_tokens);
    m.push_back(s.n_past);
    m.push_back((s.need_logits ? 1 : 0) | (s.all_logits ? 2 : 0) | (s.long_context ? 4 : 0));
    m.push_back(static_cast<int32_t>(s.block_table.size()));
    m.insert(m.end(), s.block_table.begin(), s.block_table.end());
    m.push_back(static_cast<int32_t>(s.local_block_table.size()));
    m.insert(m.end(), s.local_block_table.begin(), s.local_block_table.end());
  }
  return m;
}

std::vector<int32_t> encode_shutdown() { return {kMsgShutdown}; }

bool decode_forward_batch(const std::vector<int32_t>& m, ForwardBatch* batch) {
  auto bad = [&](const char* what) {
    fail(ErrorCode::kCorruptFile, "batch message of ", m.size(), " ints from the driver: ", what,
         "; the ranks run different shardlm binaries or a message was cut");
  };
  if (m.empty()) bad("empty");
  if (m[0] == kMsgShutdown) return false;
  if (m[0] != kMsgBatch || m.size() < 3) bad("unknown kind or no header");
  const int64_t n_seqs = m[1], n_tokens = m[2];
  if (n_seqs < 0 || n_tokens < 0 || 3 + n_tokens > static_cast<int64_t>(m.size())) bad("token count out of range");
  size_t at = 3;
  batch->token_ids.assign(m.begin() + at, m.begin() + at + n_tokens);
  at += static_cast<size_t>(n_tokens);
  batch->seqs.resize(static_cast<size_t>(n_seqs));
  int64_t sum = 0;
  for (auto& s : batch->seqs) {
    if (at + 4 > m.size()) bad("sequence header past the end");
    s.n_tokens = m[at];
    s.n_past = m[at + 1];
    if (m[at + 2] & ~7) bad("unknown chunk flags");
    s.need_logits = (m[at + 2] & 1) != 0;
    s.all_logits = (m[at + 2] & 2) != 0;
    s.long_context = (m[at + 2] & 4) != 0;
    const int32_t n_blocks = m[at + 3];
    at += 4;
    if (n_blocks < 0 || at + static_cast<size_t>(n_blocks) > m.size()) bad("block table past the end");
    s.block_table.assign(m.begin() + at, m.begin() + at + n_blocks);
    at += static_cast<size_t>(n_blocks);
    if (at + 1 > m.size()) bad("local block table count past the end");
    const int32_t n_local = m[at++];
    if (n_local < 0 || at + static_cast<size_t>(n_local) > m.size()) bad("local block table past the end");
    s.local_block_table.assign(m.begin() + at, m.begin() + at + n_local);
    at += static_cast<size_t>(n_local);
    sum += s.n_tokens;
  }
  if (at != m.size() || sum != n_tokens) bad("sizes do not add up");
  return true;
}

MpiGroupExecutor::MpiGroupExecutor(Communicator& world, const MpiGroupOptions& options)
    : world_(world), options_(options) {
  const Layout& layout = options.layout;
  if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1)
    fail(ErrorCode::kInvalidArgument, "layout ", layout.to_string(), ": every degree must be at least 1");
  if (world.size() != layout.world_size())
    fail(ErrorCode::kInvalidArgument, "mpirun started ", world.size(), " processes but ", layout.to_string(), " needs ",
         layout.world_size(), " (tp × pp × dp = ", layout.tp, " × ", layout.pp, " × ", layout.dp,
         "); run mpirun -np ", layout.world_size(), " or change -tp/-pp/-dp");
  world_config_.rank = world.rank();
  world_config_.layout = layout;
  dp_rank_ = world_config_.dp_rank();
  try {
    const ModelSpec spec = load_model_config(options.model_dir / "config.json");
    vocab_size_ = spec.vocab_size;
    Layout replica_layout = layout;
    replica_layout.dp = 1;
    validate_layout(spec, replica_layout);
    // Replica ranks ordered as in the world: tp fastest, then pp.
    replica_ = world.split(dp_rank_, world.rank());
    // The driver's KV geometry wins: it sized the cache for its scheduler.
    // So do its kernel choices: batch invariance, the dense activations
    // (--dense-activations; a rank whose CPU lacks AVX512_BF16 refuses bf16)
    // and the AWQ/GPTQ activations (--quant-activations; a rank without the
    // int8 kernels runs f32 for a matrix, as in one process); and the local
    // layers' pool (hybrid models: Gemma 3).
    int64_t geometry[7] = {options_.n_blocks,
                           options_.block_size,
                           static_cast<int64_t>(options_.kv_dtype),
                           options_.batch_invariant ? 1 : 0,
                           static_cast<int64_t>(backend::default_dense_activations()),
                           options_.n_local_blocks,
                           static_cast<int64_t>(backend::default_quant_activations())};
    replica_->broadcast(geometry, sizeof geometry, 0);
    options_.n_blocks = geometry[0];
    options_.block_size = geometry[1];
    options_.kv_dtype = static_cast<DType>(geometry[2]);
    options_.batch_invariant = geometry[3] != 0;
    if (geometry[4] != static_cast<int64_t>(backend::default_dense_activations())) {
      const auto driver = static_cast<backend::DenseActivations>(geometry[4]);
      if (driver == backend::DenseActivations::kBf16 && !backend::bf16_dot_gemm_runs())
        fail(ErrorCode::kUnsupported, "rank ", world.rank(), ": the driver runs --dense-activations bf16, but ",
             backend::bf16_dot_gemm_missing());
      backend::set_default_dense_activations(driver);
    }
    options_.n_local_blocks = geometry[5];
    backend::set_default_quant_activations(static_cast<backend::QuantActivations>(geometry[6]));
    if (options_.n_blocks < 1 || options_.block_size < 1)
      fail(ErrorCode::kInvalidArgument, "executor: n_blocks and block_size must be >= 1, got ", options_.n_blocks, " and ",
           options_.block_size);
    comms_ = split_rank_comms(*replica_, replica_layout);
    const int tp_rank = replica_->rank() % layout.tp, pp_rank = replica_->rank() / layout.tp;
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    auto rank_backend = backend::make_backend(
        {options.device, options.n_threads_per_rank > 0
                             ? options.n_threads_per_rank
                             : std::max(1, static_cast<int>(hw) / local_ranks(replica_->size())),
         options_.batch_invariant});
    RankComms* model_comms = &comms_;
    if (!options.device.is_cpu()) {
      make_device_comms(*rank_backend, world.rank());
      model_comms = &device_comms_;
    }
    if (const char* s = std::getenv("SHARDLM_TEST_FAIL_RANK"); s && std::atoi(s) == world.rank())
      fail(ErrorCode::kInternal, "SHARDLM_TEST_FAIL_RANK=", s, ": this rank fails its load on purpose");
    model_ = CausalLM::load(spec, open_checkpoint(options.model_dir), replica_layout, tp_rank, pp_rank,
                            *model_comms->tp, *model_comms->pp, std::move(rank_backend));
    cache_ = model_->make_kv_cache(options_.n_blocks, options_.block_size, options_.kv_dtype, options_.n_local_blocks);
    RankBytes mine;
    mine.world_rank = world.rank();
    mine.tp_rank = tp_rank;
    mine.pp_rank = pp_rank;
    mine.weight_bytes = model_->weight_bytes();
    mine.kv_bytes = cache_.bytes();  // what the allocator obtained, not the formula
    // Every rank reports to its driver; the driver keeps them in replica rank order.
    rank_bytes_.assign(1, mine);
    if (is_driver()) {
      rank_bytes_.resize(static_cast<size_t>(replica_->size()));
      for (int r = 1; r < replica_->size(); ++r) replica_->recv(&rank_bytes_[r], sizeof(RankBytes), r);
    } else {
      replica_->send(&mine, sizeof mine, 0);
    }
  } catch (const std::exception& e) {
    abort_world("loading the model", e);
  }
}

void MpiGroupExecutor::make_device_comms(backend::Backend& rank_backend, int world_rank) {
  if (options_.layout.pp > 1)
    fail(ErrorCode::kUnsupported, "--device ", options_.device.to_string(), " with --pp ", options_.layout.pp,
         ": pipeline stages on GPUs are not implemented yet (their activations and logits cross over host MPI "
         "messages); use --pp 1");
#if defined(SHARDLM_HAVE_NCCL)
  auto* cuda_backend = dynamic_cast<backend::cuda::CudaBackend*>(&rank_backend);
  SHARDLM_CHECK(cuda_backend != nullptr, "a ", options_.device.to_string(), " backend that is not CudaBackend");
  // Collective over the whole MPI world, as the MPI splits above were.
  auto nccl_world = NcclComm::create(MPI_COMM_WORLD, options_.device.index);
  device_replica_ = nccl_world->split(dp_rank_, world_rank);
  device_world_ = std::move(nccl_world);
  Layout replica_layout = options_.layout;
  replica_layout.dp = 1;
  device_comms_ = split_rank_comms(*device_replica_, replica_layout);
  static_cast<NcclComm&>(*device_comms_.tp).use_stream(cuda_backend->stream());
  static_cast<NcclComm&>(*device_comms_.pp).use_stream(cuda_backend->stream());
#else
  (void)rank_backend;
  (void)world_rank;
  fail(ErrorCode::kUnsupported, "--device ", options_.device.to_string(), " under mpirun needs NCCL: build with ",
       "-DSHARDLM_CUDA=ON, -DSHARDLM_MPI=ON and NCCL found (-DSHARDLM_NCCL=ON says why not)");
#endif
}

MpiGroupExecutor::~MpiGroupExecutor() {
  if (replica_ && is_driver() && !shut_down_) {
    try {
      shutdown();
    } catch (...) {
      // The world already failed; the workers were stopped by the abort.
    }
  }
}

void MpiGroupExecutor::abort_world(const char* where, const std::exception& e) {
  aborted_ = true;
  std::string what = std::string("rank ") + std::to_string(world_.rank()) + " (tp " +
                     std::to_string(world_config_.tp_rank()) + ", pp " + std::to_string(world_config_.pp_rank()) +
                     ", replica " + std::to_string(dp_rank_) + ") failed " + where + ": " + e.what();
  // MPI: the first call is MPI_Abort on the world and does not return. Over
  // LocalComm each communicator is aborted, so a peer blocked in any of them
  // (replica broadcast, TP all-reduce, PP send) throws instead of waiting.
  if (device_comms_.tp) device_comms_.tp->abort(what.c_str());
  if (device_comms_.pp) device_comms_.pp->abort(what.c_str());
  if (device_replica_) device_replica_->abort(what.c_str());
  if (device_world_) device_world_->abort(what.c_str());
  if (comms_.tp) comms_.tp->abort(what.c_str());
  if (comms_.pp) comms_.pp->abort(what.c_str());
  if (replica_) replica_->abort(what.c_str());
  world_.abort(what.c_str());
  throw Error(ErrorCode::kDistributed, what);
}

void MpiGroupExecutor::pass_message(std::vector<int32_t>& message) {
  const bool first_stage = comms_.pp->rank() == 0;
  int64_t n = static_cast<int64_t>(message.size());
  if (first_stage) {
    comms_.tp->broadcast(&n, sizeof n, 0);
  } else {
    comms_.pp->recv(&n, sizeof n, comms_.pp->rank() - 1);
  }
  if (n < 1 || n > (int64_t{1} << 31))
    fail(ErrorCode::kCorruptFile, "batch message of ", n, " ints announced by the driver");
  message.resize(static_cast<size_t>(n));
  if (first_stage) {
    comms_.tp->broadcast(message.data(), message.size() * sizeof(int32_t), 0);
  } else {
    comms_.pp->recv(message.data(), message.size() * sizeof(int32_t), comms_.pp->rank() - 1);
  }
  if (comms_.pp->rank() + 1 < comms_.pp->size()) {
    comms_.pp->send_async(&n, sizeof n, comms_.pp->rank() + 1);
    comms_.pp->send_async(message.data(), message.size() * sizeof(int32_t), comms_.pp->rank() + 1);
  }
}

void MpiGroupExecutor::submit(ForwardBatch batch) {
  if (!is_driver()) fail(ErrorCode::kInternal, "submit is for the replica's driver; other ranks call run_worker");
  if (shut_down_) fail(ErrorCode::kInternal, "submit after shutdown");
  SHARDLM_CHECK(static_cast<int>(in_flight_.size()) < max_in_flight(), "submit beyond max_in_flight (",
                max_in_flight(), ")");
  try {
    std::vector<int32_t> message = encode_forward_batch(batch);
    pass_message(message);
    InFlight job;
    job.batch = std::move(batch);
    const bool single_stage = options_.layout.pp == 1;
    if (single_stage) {
      job.logits = std::move(spare_logits_);  // no vocab-sized allocation and zero fill per step
      job.logits.resize(static_cast<size_t>(job.batch.n_logits() * vocab_size_));
    }
    model_->run_stage(job.batch, cache_, single_stage ? job.logits.data() : nullptr);
    in_flight_.push_back(std::move(job));
  } catch (const std::exception& e) {
    abort_world("running a batch", e);
  }
}

void MpiGroupExecutor::collect(float* logits) {
  if (!is_driver()) fail(ErrorCode::kInternal, "collect is for the replica's driver");
  SHARDLM_CHECK(!in_flight_.empty(), "collect with no batch submitted");
  InFlight job = std::move(in_flight_.front());
  in_flight_.pop_front();
  try {
    if (options_.layout.pp == 1) {
      std::copy(job.logits.begin(), job.logits.end(), logits);
      spare_logits_ = std::move(job.logits);
    } else {
      model_->receive_logits(job.batch, logits);
    }
  } catch (const std::exception& e) {
    abort_world("receiving logits", e);
  }
}

void MpiGroupExecutor::collect_into(std::vector<float>& logits, int64_t n_logits) {
  if (!is_driver()) fail(ErrorCode::kInternal, "collect is for the replica's driver");
  if (options_.layout.pp != 1 || in_flight_.empty()) {  // the last stage's logits arrive by message
    ModelExecutor::collect_into(logits, n_logits);
    return;
  }
  InFlight job = std::move(in_flight_.front());
  in_flight_.pop_front();
  check_logit_rows(job.logits.size(), n_logits, vocab_size_);
  std::swap(logits, job.logits);
  spare_logits_ = std::move(job.logits);
}

void MpiGroupExecutor::execute(const ForwardBatch& batch, float* logits) {
  SHARDLM_CHECK(in_flight_.empty(), "execute with batches in flight; collect them first");
  submit(batch);
  collect(logits);
}

void MpiGroupExecutor::run_worker() {
  if (is_driver()) fail(ErrorCode::kInternal, "run_worker is for the non-driver ranks");
  try {
    std::vector<int32_t> message;
    for (;;) {
      pass_message(message);
      if (!decode_forward_batch(message, &batch_)) return;
      model_->run_stage(batch_, cache_, nullptr);
    }
  } catch (const std::exception& e) {
    abort_world("running a batch", e);
  }
}

void MpiGroupExecutor::shutdown() {
  if (!is_driver() || shut_down_) return;
  // Logits still on their way are received first: the last stage's sends
  // must complete before its process may exit.
  std::vector<float> discard;
  while (!in_flight_.empty()) {
    discard.resize(static_cast<size_t>(in_flight_.front().batch.n_logits() * vocab_size_));
    collect(discard.data());
  }
  shut_down_ = true;
  std::vector<int32_t> message = encode_shutdown();
  pass_message(message);
}

std::string describe_rank_bytes(const std::vector<RankBytes>& ranks) {
  std::string s;
  for (const auto& r : ranks)
    s += "rank " + std::to_string(r.world_rank) + " (tp " + std::to_string(r.tp_rank) + ", pp " +
         std::to_string(r.pp_rank) + "): weights " + std::to_string(r.weight_bytes) + " bytes, kv " +
         std::to_string(r.kv_bytes) + " bytes\n";
  return s;
}

GenerateResult generate_mpi(Communicator& world, const std::filesystem::path& model_dir,
                            const std::vector<int32_t>& prompt, const GenerateOptions& opt,
                            std::vector<RankBytes>* rank_bytes) {
  const ModelSpec spec = load_model_config(model_dir / "config.json");
  validate_generate(spec, prompt, opt);
  MpiGroupOptions mo;
  mo.model_dir = model_dir;
  mo.layout = opt.layout;
  mo.n_blocks = generate_kv_blocks(prompt, opt);
  mo.block_size = opt.block_size;
  mo.kv_dtype = opt.kv_dtype;
  mo.device = opt.device;
  mo.batch_invariant = opt.batch_invariant || opt.speculative.enabled();  // verification needs it
  MpiGroupExecutor executor(world, mo);
  if (!executor.is_driver()) {
    executor.run_worker();
    return {};
  }
  GenerateResult r;
  try {
    auto step = [&](const ForwardBatch& batch, float* logits) { executor.execute(batch, logits); };
    GenerateOptions o = opt;
    o.long_context = o.long_context || spec.long_context(static_cast<int64_t>(prompt.size()));
    std::unique_ptr<DraftModel> draft;  // on the driver (rank 0), on a backend of its own
    if (opt.speculative.uses_draft_model()) {
      draft = std::make_unique<DraftModel>(opt.speculative.draft_model, spec.vocab_size,
                                           backend::make_backend({opt.device, 0, false}),
                                           static_cast<int64_t>(prompt.size()) + opt.max_tokens, opt.block_size,
                                           opt.kv_dtype);
      o.draft = [&](std::span<const int32_t> context, int64_t k) { return draft->propose(context, k); };
    }
    r = generate_steps(step, spec.vocab_size, mo.n_blocks, prompt, o, false, nullptr, true);
    if (draft) {
      r.draft_weight_bytes = draft->weight_bytes();
      r.draft_kv_bytes = draft->kv_bytes();
    }
  } catch (const std::exception& e) {
    // The workers wait for the next batch: stop them with the reason.
    std::string what = std::string("rank 0 failed generating: ") + e.what();
    world.abort(what.c_str());
    throw;
  }
  executor.shutdown();
  r.weight_bytes_rank0 = executor.model().weight_bytes();
  if (rank_bytes) *rank_bytes = executor.rank_bytes();
  return r;
}

}  // namespace shardlm
