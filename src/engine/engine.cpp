#include "engine/engine.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.h"
#include "engine/batch_builder.h"
#include "model/draft_model.h"
#include "sampling/token_mask.h"

namespace shardlm {

namespace {

SchedulerConfig scheduler_config_for(const EngineConfig& config, int64_t vocab_size) {
  SchedulerConfig sc = config.scheduler;
  if (config.prompt_logits_bytes > 0 && vocab_size > 0) {
    const int64_t rows = config.prompt_logits_bytes / (vocab_size * int64_t(sizeof(float)));
    sc.max_prompt_logit_rows = static_cast<int32_t>(std::clamp<int64_t>(rows, 1, std::max(1, sc.max_num_batched_tokens)));
  }
  return sc;
}

}  // namespace

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
  }
  return "";
}

Engine::Engine(const EngineConfig& config, ModelExecutor& executor, const Detokenizer* detokenizer)
    : config_(config),
      executor_(executor),
      detokenizer_(detokenizer),
      vocab_size_(executor.vocab_size()),
      sched_(scheduler_config_for(config, executor.vocab_size())),
      mask_worker_(
          [this] {
            std::lock_guard<std::mutex> lock(mutex_);
            masks_done_ = true;
            cv_.notify_one();
          },
          config.before_mask_job),
      host_workers_(std::max(0, config.host_workers)) {
  if (vocab_size_ < 1) fail(ErrorCode::kInvalidArgument, "engine: model vocab_size must be >= 1, got ", vocab_size_);
  const auto& sc = config.scheduler;
  if ((executor.n_kv_blocks() > 0 && executor.n_kv_blocks() != sc.n_blocks) ||
      (executor.kv_block_size() > 0 && executor.kv_block_size() != sc.block_size))
    fail(ErrorCode::kInvalidArgument, "engine: the model's KV cache has ", executor.n_kv_blocks(), " blocks of ",
         executor.kv_block_size(), " tokens but the scheduler was configured for ", sc.n_blocks, " blocks of ",
         sc.block_size, "; build both from the same numbers");
  if (executor.n_local_kv_blocks() != sc.n_local_blocks && (executor.n_kv_blocks() > 0 || sc.n_local_blocks > 0))
    fail(ErrorCode::kInvalidArgument, "engine: the model's local-layer KV pool has ", executor.n_local_kv_blocks(),
         " blocks but the scheduler was configured for ", sc.n_local_blocks,
         " (SchedulerConfig::n_local_blocks); build both from the same numbers");
  if (config.max_batches_in_flight < 0)
    fail(ErrorCode::kInvalidArgument, "engine: max_batches_in_flight must be >= 0, got ", config.max_batches_in_flight);
  config.speculative.validate();
  if (config.speculative.uses_draft_model() && !config.draft_model)
    fail(ErrorCode::kInvalidArgument, "engine: --speculative-config names a draft model (", config.speculative.draft_model,
         ") but none was loaded (EngineConfig::draft_model)");
  if (config.speculative_max_decodes < 0)
    fail(ErrorCode::kInvalidArgument, "engine: speculative_max_decodes must be >= 0, got ", config.speculative_max_decodes);
  max_in_flight_ = std::max(1, executor.max_in_flight());
  if (config.max_batches_in_flight > 0) max_in_flight_ = std::min(max_in_flight_, int(config.max_batches_in_flight));
  if (config.burst_window_ms < 0 || !std::isfinite(config.burst_window_ms))
    fail(ErrorCode::kInvalidArgument, "engine: burst_window_ms must be a finite number >= 0, got ", config.burst_window_ms);
  metrics_.update([&](MetricsSnapshot& m) { m.spec_decode_positions = config.speculative.num_speculative_tokens; });
  update_gauges();
  // Last: nothing after it throws, so the destructor always removes it.
  if (config_.arrivals)
    arrivals_listener_ = config_.arrivals->add_listener([this] {
      std::lock_guard<std::mutex> lock(mutex_);
      cv_.notify_one();
    });
}

Engine::~Engine() {
  try {
    stop(/*drain=*/false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlm engine: error while stopping: %s\n", e.what());
  }
  if (arrivals_listener_) config_.arrivals->remove_listener(arrivals_listener_);
}

void Engine::validate(const EngineRequest& r) const {
  if (r.request_id.empty()) fail(ErrorCode::kInvalidArgument, "request_id must not be empty");
  if (r.n < 1 || r.n > config_.max_n)
    fail(ErrorCode::kInvalidArgument, "n must be between 1 and ", config_.max_n, ", got ", r.n);
  for (size_t i = 0; i < r.prompt_token_ids.size(); ++i)
    if (r.prompt_token_ids[i] < 0 || r.prompt_token_ids[i] >= vocab_size_)
      fail(ErrorCode::kInvalidArgument, "prompt token ", i, " has id ", r.prompt_token_ids[i],
           ", outside the vocabulary [0, ", vocab_size_, ")");
  Scheduler::check_fits(config_.scheduler, static_cast<int32_t>(r.prompt_token_ids.size()), r.stop.max_tokens);
  r.sampling.validate();
  if (r.prompt_logprobs < -1 || r.prompt_logprobs > vocab_size_)
    fail(ErrorCode::kInvalidArgument, "prompt_logprobs must be between 0 and the vocabulary size (", vocab_size_,
         "), or -1 for none; got ", r.prompt_logprobs);
  if (r.stop.min_tokens < 0 || r.stop.min_tokens > r.stop.max_tokens)
    fail(ErrorCode::kInvalidArgument, "min_tokens must be between 0 and max_tokens (", r.stop.max_tokens,
         "), got ", r.stop.min_tokens);
  for (int32_t t : r.stop.stop_token_ids)
    if (t < 0 || t >= vocab_size_)
      fail(ErrorCode::kInvalidArgument, "stop_token_ids contains ", t, ", outside the vocabulary [0, ",
           vocab_size_, ")");
  if (r.grammar && r.grammar->vocabulary().size() > vocab_size_)
    fail(ErrorCode::kInvalidArgument, "the grammar was compiled for ", r.grammar->vocabulary().size(),
         " tokens but the model has ", vocab_size_);
  for (const auto& s : r.stop.stop) {
    if (s.empty()) fail(ErrorCode::kInvalidArgument, "stop strings must not be empty");
    if (!detokenizer_)
      fail(ErrorCode::kUnsupported, "stop strings need a tokenizer, and this engine runs without one");
  }
}

void Engine::submit(EngineRequest request, RequestCallbacks callbacks) {
  validate(request);
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_requested_) fail(ErrorCode::kUnsupported, "the engine is shutting down and takes no new requests");
  if (!health_.ok)
    fail(ErrorCode::kDistributed, "the model executor is down", health_.fatal ? "" : " (restarting)", ": ",
         health_.error);
  if (config_.max_live_requests > 0 && static_cast<int32_t>(live_ids_.size()) >= config_.max_live_requests)
    fail(ErrorCode::kOutOfMemory, "the engine already holds ", live_ids_.size(),
         " requests (max_live_requests); retry later");
  if (!live_ids_.insert(request.request_id).second)
    fail(ErrorCode::kInvalidArgument, "request_id '", request.request_id, "' is already in use by a live request");
  Command cmd;
  cmd.kind = Command::Kind::kSubmit;
  cmd.request = std::move(request);
  cmd.callbacks = std::move(callbacks);
  cmd.time = Clock::now();
  queue_.push_back(std::move(cmd));
  cv_.notify_one();
}

void Engine::abort(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Command cmd;
  cmd.kind = Command::Kind::kAbort;
  cmd.request_id = request_id;
  cmd.time = Clock::now();
  queue_.push_back(std::move(cmd));
  cv_.notify_one();
}

EngineHealth Engine::health() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return health_;
}

void Engine::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (thread_.joinable() || stop_requested_) return;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stop_requested_) {
      stop_requested_ = true;
      drain_ = drain;
    } else if (!drain) {
      drain_ = false;
    }
    cv_.notify_one();
  }
  if (thread_.joinable()) {
    thread_.join();
    return;
  }
  // Not started: finish (or abort) what is queued on this thread.
  drain_queue();
  if (!drain) abort_all("");
  run_until_idle();
}

void Engine::loop() {
  for (;;) {
    bool stopping = false, drain = true;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // All runnable sequences held for their masks: sleep until one is done.
      cv_.wait(lock, [&] {
        return !queue_.empty() || stop_requested_ || masks_done_ || (!idle() && !waiting_for_masks_);
      });
      if (idle() && !stop_requested_ && config_.arrivals && config_.burst_window_ms > 0) gather_burst(lock);
      masks_done_ = false;
      waiting_for_masks_ = false;
      stopping = stop_requested_;
      drain = drain_;
    }
    try {
      drain_queue();
      if (stopping && !drain) abort_all("");
      if (idle()) {
        if (stopping) {
          std::lock_guard<std::mutex> lock(mutex_);
          if (queue_.empty()) break;
        }
        continue;
      }
      step_inner();
    } catch (const std::exception& e) {
      // A bug, not user input: fail what is in flight, keep serving.
      std::fprintf(stderr, "shardlm engine: step failed: %s\n", e.what());
      abort_all(std::string("internal engine error: ") + e.what());
    }
  }
}

void Engine::gather_burst(std::unique_lock<std::mutex>& lock) {
  Arrivals& arrivals = *config_.arrivals;
  Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
  int64_t n_submits = 0;
  auto count = [&] {
    n_submits = 0;
    for (const Command& c : queue_)
      if (c.kind == Command::Kind::kSubmit) {
        ++n_submits;
        first = std::min(first, c.time);
        last = std::max(last, c.time);
      }
  };
  count();
  if (n_submits == 0) return;
  const auto deadline =
      first + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(config_.burst_window_ms));
  const auto quiet = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(kBurstQuietMs));
  bool held = false;
  Clock::time_point held_since;
  for (;;) {
    const int64_t pending = arrivals.n_pending();
    const auto now = Clock::now();
    if (stop_requested_ || now >= deadline) break;
    auto until = deadline;
    if (pending == 0) {
      if (n_submits < 2) break;  // a lone request goes at once
      until = std::min(until, std::max(last, arrivals.last_announced()) + quiet);
      if (now >= until) break;
    }
    if (!held) {
      arrivals.note_engine_waiting();
      held = true;
      held_since = now;
    }
    cv_.wait_until(lock, until);  // a submission, an announcement or a release wakes it
    count();
  }
  if (!held) return;
  const double s = std::chrono::duration<double>(Clock::now() - held_since).count();
  metrics_.update([s](MetricsSnapshot& m) {
    ++m.burst_holds_total;
    m.burst_hold_seconds_total += s;
  });
}

bool Engine::run_step() {
  drain_queue();
  if (idle()) {
    update_gauges();
    return false;
  }
  return step_inner();
}

void Engine::run_until_idle() {
  for (;;) {
    if (run_step()) continue;
    if (idle()) return;
    wait_for_masks();  // not idle, nothing scheduled: every runnable sequence is held
  }
}

void Engine::wait_for_masks() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return masks_done_; });
  masks_done_ = false;
  waiting_for_masks_ = false;
}

void Engine::defer_mask_if_new(SeqState& seq) {
  if (!seq.matcher || seq.matcher->next_mask_cached() ||
      seq.matcher->grammar().last_walk_ms() < config_.defer_mask_walk_ms)
    return;
  seq.pending_mask = mask_worker_.post(seq.request->request.grammar, seq.matcher->state());
  sched_.set_held(seq.id, true);
  held_.push_back(seq.id);
  metrics_.update([](MetricsSnapshot& m) { ++m.grammar_masks_deferred_total; });
}

void Engine::release_ready_masks() {
  size_t kept = 0;
  for (SeqId id : held_) {
    auto it = seqs_.find(id);
    if (it == seqs_.end()) continue;  // ended while held
    const auto& pending = it->second->pending_mask;
    if (pending && !pending->done) {
      held_[kept++] = id;
      continue;
    }
    sched_.set_held(id, false);
  }
  held_.resize(kept);
}

void Engine::drain_queue() {
  std::deque<Command> cmds;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cmds.swap(queue_);
  }
  for (Command& cmd : cmds) {
    if (cmd.kind == Command::Kind::kSubmit) {
      add_request(std::move(cmd));
    } else {
      abort_request(cmd.request_id, "");
    }
  }
  update_gauges();
}

void Engine::mask_draft_rows(std::span<const int32_t> draft, grammar::GrammarMatcher& matcher, int64_t first_row) {
  // Row j + 1 follows draft[j]: its mask is the grammar's after draft[0..j].
  // The drafts were cut to what the grammar accepts (propose_drafts); the
  // matcher is put back where it was, and the tokens produced are accepted
  // one by one as without drafts.
  static thread_local std::vector<uint32_t> mask;
  const size_t words = size_t(matcher.grammar().vocabulary().n_mask_words());
  mask.resize(words);
  int32_t n_accepted = 0;
  for (size_t j = 0; j < draft.size(); ++j) {
    if (!matcher.accept_token(draft[j])) break;  // the row verifying draft[j] rejects it: no later row is read
    ++n_accepted;
    if (matcher.is_terminated()) break;
    if (!matcher.fill_next_token_bitmask(mask)) break;
    float* row = logits_.data() + (first_row + int64_t(j) + 1) * vocab_size_;
    apply_token_bitmask(std::span<float>(row, size_t(vocab_size_)), mask);
  }
  matcher.rollback(n_accepted);
}

void Engine::add_request(Command&& cmd) {
  auto rs = std::make_unique<RequestState>();
  rs->request = std::move(cmd.request);
  rs->callbacks = std::move(cmd.callbacks);
  rs->arrival = cmd.time;
  const EngineRequest& r = rs->request;
  SeqId lead = -1;
  const BlockHash root = cache_root(r.cache_salt);
  for (int32_t i = 0; i < r.n; ++i) {
    auto s = std::make_unique<SeqState>();
    s->request = rs.get();
    s->index = i;
    s->id = next_seq_id_++;
    SamplingParams params = r.sampling;
    if (params.seed) params.seed = *params.seed + uint64_t(i);  // siblings draw differently, reproducibly
    params.return_logprob = r.logprobs;  // no log_softmax pass over the vocabulary unless returned
    s->sampler = config_.make_sampler ? config_.make_sampler(params, r.prompt_token_ids, vocab_size_)
                                      : std::make_unique<Sampler>(params, r.prompt_token_ids, vocab_size_);
    if (detokenizer_) s->detok = detokenizer_->stream(r.prompt_token_ids, r.skip_special_tokens);
    s->stops = std::make_unique<StopStringMatcher>(r.stop.stop, r.stop.include_stop_str_in_output);
    if (r.grammar) s->matcher = std::make_unique<grammar::GrammarMatcher>(r.grammar);
    // Sequence 0 computes the prompt logprobs; its siblings share its blocks.
    sched_.add(s->id, r.prompt_token_ids, r.stop.max_tokens, lead, root, i == 0 && r.prompt_logprobs >= 0);
    if (i == 0) lead = s->id;
    rs->seq_ids.push_back(s->id);
    seqs_.emplace(s->id, std::move(s));
  }
  rs->n_unfinished = r.n;
  if (r.prompt_logprobs >= 0) rs->prompt_logprobs.resize(r.prompt_token_ids.size() - 1);
  std::string id = r.request_id;
  requests_.emplace(std::move(id), std::move(rs));
}

SequenceOutput Engine::make_output(const SeqState& seq) const {
  SequenceOutput out;
  out.request_id = seq.request->request.request_id;
  out.index = seq.index;
  out.n_prompt_tokens = static_cast<int32_t>(seq.request->request.prompt_token_ids.size());
  out.n_completion_tokens = static_cast<int32_t>(seq.output_ids.size());
  out.n_cached_tokens = sched_.has(seq.id) ? sched_.n_prefix_hit_tokens(seq.id) : 0;
  out.elapsed_s = std::chrono::duration<double>(Clock::now() - seq.request->arrival).count();
  out.time_to_first_token_s = seq.request->ttft_s;
  return out;
}

void Engine::emit(RequestState& request, const SequenceOutput& out) {
  if (!request.callbacks.on_output) return;
  try {
    request.callbacks.on_output(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardlm engine: output callback of request %s threw: %s\n",
                 request.request.request_id.c_str(), e.what());
  }
}

// Sets out.request_finished; frees the KV blocks; the caller emits `out`
// and, when the request is finished, must not touch it afterwards.
void Engine::finish_seq(SeqState& seq, SequenceOutput& out) {
  seq.finished = true;
  sched_.finish(seq.id);
  if (config_.draft_model) config_.draft_model->release(seq.id);
  RequestState& rs = *seq.request;
  const std::string reason = finish_reason_name(out.finish_reason);
  const double e2e = std::chrono::duration<double>(Clock::now() - rs.arrival).count();
  out.request_finished = --rs.n_unfinished == 0;
  metrics_.update([&](MetricsSnapshot& m) {
    if (out.request_finished) {
      ++m.request_success_total[reason];
      m.e2e_request_latency_seconds.observe(e2e);
    }
  });
}

void Engine::abort_request(const std::string& request_id, const std::string& error) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  RequestState& rs = *it->second;
  for (SeqId id : rs.seq_ids) {
    SeqState& seq = *seqs_.at(id);
    if (seq.finished) continue;
    SequenceOutput out = make_output(seq);
    out.finish_reason = FinishReason::kAbort;
    out.error = error;
    finish_seq(seq, out);
    emit(rs, out);
  }
  for (SeqId id : rs.seq_ids) seqs_.erase(id);
  requests_.erase(it);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live_ids_.erase(request_id);
  }
  update_gauges();
}

void Engine::abort_all(const std::string& error) {
  std::vector<std::string> ids;
  for (const auto& [id, rs] : requests_) ids.push_back(id);
  for (const auto& id : ids) abort_request(id, error);
}

void Engine::fail_plan(const StepPlan& plan, const std::exception& e) {
  sched_.release(plan);
  std::vector<std::string> ids;
  for (const auto& sc : plan.seqs)
    if (auto it = seqs_.find(sc.seq_id); it != seqs_.end()) ids.push_back(it->second->request->request.request_id);
  for (const auto& id : ids) abort_request(id, std::string("model execution failed: ") + e.what());
}

void Engine::executor_failed(const StepPlan& plan, const std::exception& e) {
  if (executor_.healthy()) {  // one batch failed; the executor runs on
    fail_plan(plan, e);
    return;
  }
  const auto t0 = Clock::now();
  const std::string what = e.what();
  bool fatal = false;
  int32_t n_failures = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fatal = health_.fatal;
    if (!fatal) {
      health_.ok = false;
      health_.error = what;
      ++health_.n_failures;
      fatal = health_.n_restarts >= config_.max_executor_restarts;
    }
    n_failures = health_.n_failures;
  }
  metrics_.update([&](MetricsSnapshot& m) {
    m.executor_failures_total = n_failures;
    m.executor_up = false;
    m.executor_last_failure = what;
  });
  std::fprintf(stderr, "shardlm engine: the model executor failed: %s\n", what.c_str());
  // Nothing in flight will land: release every plan so that ending the
  // requests frees their blocks now, then fail all of them with the error.
  sched_.release(plan);
  for (const StepPlan& p : in_flight_) sched_.release(p);
  in_flight_.clear();
  abort_all(std::string("model execution failed: ") + what);
  std::string reason;
  if (!fatal) {
    try {
      if (executor_.restart()) {
        const double recovery = std::chrono::duration<double>(Clock::now() - t0).count();
        std::fprintf(stderr, "shardlm engine: the model executor restarted in %.3f s\n", recovery);
        std::lock_guard<std::mutex> lock(mutex_);
        health_.ok = true;
        health_.error.clear();
        ++health_.n_restarts;
        health_.last_recovery_s = recovery;
        metrics_.update([&](MetricsSnapshot& m) {
          ++m.executor_restarts_total;
          m.executor_up = true;
          m.executor_last_recovery_seconds = recovery;
        });
        return;
      }
      reason = "its ranks are other processes and cannot be restarted in place";
    } catch (const std::exception& again) {
      reason = std::string("restarting it failed: ") + again.what();
    }
  } else {
    reason = str_cat("it failed after ", config_.max_executor_restarts, " restarts (max_executor_restarts)");
  }
  std::fprintf(stderr, "shardlm engine: the model executor is down for good: %s\n", reason.c_str());
  std::lock_guard<std::mutex> lock(mutex_);
  if (!health_.fatal) health_.error = what + "; " + reason;
  health_.ok = false;
  health_.fatal = true;
}

bool Engine::step_inner() {
  // Fill the pipeline: each plan leaves out the sequences already in flight,
  // and takes about its share of the live ones, so that a burst of requests
  // arriving together is split over the micro-batches instead of moving
  // through the stages as one batch with the other stages idle.
  release_ready_masks();
  while (static_cast<int>(in_flight_.size()) < max_in_flight_) {
    int32_t share = 0;
    if (max_in_flight_ > 1) {
      const int32_t n_live = sched_.n_running() + sched_.n_waiting();
      share = std::max<int32_t>(1, (n_live + max_in_flight_ - 1) / max_in_flight_);
    }
    StepPlan plan = sched_.schedule(share);
    if (plan.empty()) break;
    propose_drafts(plan);  // speculative decoding: drafted rows for its decodes (engine/speculation.cpp)
    // The watermark: what this step holds, before finished sequences free theirs.
    metrics_.update([st = sched_.stats()](MetricsSnapshot& m) {
      m.kv_blocks_in_use_peak = std::max<int64_t>(m.kv_blocks_in_use_peak, st.n_blocks_used);
      m.kv_local_blocks_in_use_peak = std::max<int64_t>(m.kv_local_blocks_in_use_peak, st.n_local_blocks_used);
    });
    try {
      executor_.submit(make_forward_batch(plan));
    } catch (const std::exception& e) {
      executor_failed(plan, e);
      return true;
    }
    const bool overlapped = !in_flight_.empty();
    in_flight_.push_back(std::move(plan));
    if (overlapped) metrics_.update([](MetricsSnapshot& m) { ++m.pipeline_overlapped_batches_total; });
  }
  if (in_flight_.empty() && !held_.empty()) {
    waiting_for_masks_ = true;
    return false;
  }
  SHARDLM_CHECK(!in_flight_.empty(), "scheduler made no progress with ", sched_.n_running(), " running and ",
                sched_.n_waiting(), " waiting sequences");
  const StepPlan plan = std::move(in_flight_.front());
  in_flight_.pop_front();
  // Rows of logits_: each chunk's n_logit_rows() in plan order; a sampled
  // sequence samples its chunk's last row, or a drafted decode its first.
  int64_t n_logits = 0;
  bool any_prompt_logits = false;
  std::vector<int64_t>& first_row = first_row_;
  std::vector<int64_t>& sample_row = sample_row_;
  first_row.assign(plan.seqs.size(), 0);
  sample_row.assign(plan.seqs.size(), -1);
  for (size_t k = 0; k < plan.seqs.size(); ++k) {
    const ScheduledSeq& sc = plan.seqs[k];
    first_row[k] = n_logits;
    n_logits += sc.n_logit_rows();
    // A prompt-logprobs chunk samples after its last row; a decode with
    // drafts samples its first row (the fed token's), the drafts' follow.
    if (sc.need_logits) sample_row[k] = sc.all_logits ? n_logits - 1 : first_row[k];
    any_prompt_logits = any_prompt_logits || sc.all_logits;
  }
  try {
    executor_.collect_into(logits_, n_logits);  // every entry written: no zero fill
  } catch (const std::exception& e) {
    // The KV of the scheduled sequences is in doubt: end them with the error.
    executor_failed(plan, e);
    return true;
  }

  // Every time: a draft model's CPU backend sets this thread's count for its forward.
  if (config_.host_threads > 0) omp_set_num_threads(config_.host_threads);
  std::vector<int32_t> sampled(plan.seqs.size(), -1);
  std::vector<std::optional<TokenLogprobs>> logprobs(plan.seqs.size());
  std::vector<std::string> failed_requests;  // "request_id\nerror" of constrained sequences whose mask failed
  // The plan is off in_flight_ and not committed: whatever throws before
  // commit must release it, or its sequences' blocks would never return.
  try {
    if (any_prompt_logits) record_prompt_logprobs(plan, first_row);
    std::vector<int32_t> banned;

    // Structured output: the grammar bitmask of every constrained sequence
    // of this step, filled in parallel (masks of states seen before are
    // cached copies; new states walk the vocabulary).
    struct MaskJob {
      size_t k;
      int64_t row;
      SeqState* seq;
    };
    std::vector<MaskJob> jobs;
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      if (!plan.seqs[k].need_logits) continue;
      auto live = seqs_.find(plan.seqs[k].seq_id);
      if (live != seqs_.end() && live->second->matcher) jobs.push_back({k, sample_row[k], live->second.get()});
    }
    size_t n_words = 0;
    std::vector<std::string> mask_errors(jobs.size());
    if (!jobs.empty()) {
      n_words = size_t(jobs[0].seq->matcher->grammar().vocabulary().n_mask_words());
      for (const auto& j : jobs)
        n_words = std::max(n_words, size_t(j.seq->matcher->grammar().vocabulary().n_mask_words()));
      masks_.assign(jobs.size() * n_words, 0u);
      const int64_t n_jobs = static_cast<int64_t>(jobs.size());
#pragma omp parallel for schedule(dynamic) if (n_jobs > 1)
      for (int64_t i = 0; i < n_jobs; ++i) {
        auto& m = *jobs[size_t(i)].seq->matcher;
        const size_t words = size_t(m.grammar().vocabulary().n_mask_words());
        const std::span<uint32_t> mask(masks_.data() + size_t(i) * n_words, words);
        const auto& pending = jobs[size_t(i)].seq->pending_mask;
        try {
          bool any = false;
          if (pending && pending->done && pending->state == m.state()) {  // computed while the sequence was held
            if (!pending->error.empty()) throw std::runtime_error(pending->error);
            any = m.fill_next_token_bitmask_from(pending->mask, mask);
          } else {
            any = m.fill_next_token_bitmask(mask);
          }
          if (!any) mask_errors[size_t(i)] = "structured output: the grammar allows no token of this vocabulary here";
          if (any) mask_draft_rows(plan.seqs[jobs[size_t(i)].k].draft_ids, m, jobs[size_t(i)].row);
        } catch (const std::exception& e) {
          mask_errors[size_t(i)] = std::string("structured output: ") + e.what();
        }
      }
    }
    size_t next_job = 0;

    // Rows to sample, after masks and bans; each sequence's sampler has its
    // own RNG and the scratch is per thread, so rows sample in parallel.
    sample_jobs_.clear();
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      if (!plan.seqs[k].need_logits) continue;
      auto live = seqs_.find(plan.seqs[k].seq_id);
      if (live == seqs_.end()) continue;  // aborted while its batch was in flight
      SeqState& seq = *live->second;
      const EngineRequest& r = seq.request->request;
      float* row_logits = logits_.data() + sample_row[k] * vocab_size_;
      if (seq.matcher) {
        const size_t j = next_job++;
        SHARDLM_CHECK(j < jobs.size() && jobs[j].k == k);
        if (!mask_errors[j].empty()) {
          failed_requests.push_back(r.request_id + "\n" + mask_errors[j]);
          continue;
        }
        apply_token_bitmask(std::span<float>(row_logits, size_t(vocab_size_)),
                            std::span<const uint32_t>(masks_.data() + j * n_words, n_words));
      }
      banned.clear();
      const int64_t n_out = static_cast<int64_t>(seq.output_ids.size());
      if (n_out < r.stop.min_tokens && !seq.matcher) {
        banned = r.stop.stop_token_ids;
        if (!r.stop.ignore_eos) banned.insert(banned.end(), config_.eos_token_ids.begin(), config_.eos_token_ids.end());
      }
      // Row j of a drafted sequence (1 + d rows) produces output n_out + j:
      // each of them below min_tokens bans the stop tokens, as a plain step there would.
      const int64_t n_rows = 1 + static_cast<int64_t>(plan.seqs[k].draft_ids.size());
      for (int64_t j = 0; j < n_rows && n_out + j < r.stop.min_tokens && !banned.empty(); ++j)
        for (int32_t t : banned) row_logits[j * vocab_size_ + t] = -std::numeric_limits<float>::infinity();
      sample_jobs_.push_back({k, row_logits, &seq, nullptr});
    }
    verified_.assign(plan.seqs.size(), VerifiedDraft{});
    n_accepted_.assign(plan.seqs.size(), 0);
    const int64_t n_sample = static_cast<int64_t>(sample_jobs_.size());
    // Only batches of real work go parallel (EngineConfig).
    const bool parallel = n_sample > 1 && n_sample * vocab_size_ >= config_.parallel_sampling_min_work;
    auto sample_one = [&](int64_t i) {
      SampleJob& job = sample_jobs_[size_t(i)];
      const size_t k = job.k;
      try {
        if (const auto& draft = plan.seqs[k].draft_ids; !draft.empty()) {  // its 1 + d rows, in order
          verified_[k] = verify_draft_rows(*job.seq->sampler, draft, job.logits, vocab_size_,
                                           job.seq->request->request.logprobs);
          sampled[k] = verified_[k].token;
          n_accepted_[k] = verified_[k].n_accepted;
          return;
        }
        SampleResult res = job.seq->sampler->sample(std::span<const float>(job.logits, size_t(vocab_size_)));
        sampled[k] = res.token;
        if (job.seq->request->request.logprobs) {
          TokenLogprobs lp;
          lp.token_id = res.token;
          lp.logprob = res.logprob;
          lp.rank = vocab_rank(std::span<const float>(job.logits, size_t(vocab_size_)), res.token);
          lp.top = std::move(res.top_logprobs);
          logprobs[k] = std::move(lp);
        }
      } catch (...) {
        job.error = std::current_exception();
      }
    };
    if (parallel && host_workers_.n_threads() > 1) {
      host_workers_.parallel_for(
          n_sample, [](void* f, int64_t i) { (*static_cast<decltype(sample_one)*>(f))(i); }, &sample_one);
    } else {
#pragma omp parallel for schedule(dynamic) if (parallel)
      for (int64_t i = 0; i < n_sample; ++i) sample_one(i);
    }
    for (const SampleJob& job : sample_jobs_)
      if (job.error) std::rethrow_exception(job.error);  // the first failing row, in batch order
  } catch (const std::exception& e) {
    fail_plan(plan, e);
    return true;
  }

  // A constrained sequence whose mask failed still needs a token for the
  // commit; its request is aborted right after.
  for (size_t k = 0; k < plan.seqs.size(); ++k)
    if (plan.seqs[k].need_logits && sampled[k] < 0 && seqs_.count(plan.seqs[k].seq_id)) sampled[k] = 0;
  sched_.commit(plan, sampled, n_accepted_);
  const auto now = Clock::now();
  std::unordered_set<std::string> failing;
  for (const auto& f : failed_requests) failing.insert(f.substr(0, f.find('\n')));
  for (size_t k = 0; k < plan.seqs.size(); ++k) {
    if (sampled[k] < 0) continue;
    auto it = seqs_.find(plan.seqs[k].seq_id);
    if (it == seqs_.end()) continue;  // its request finished earlier in this loop
    const std::string request_id = it->second->request->request.request_id;
    if (failing.count(request_id)) continue;
    try {
      if (!plan.seqs[k].draft_ids.empty())
        emit_verified(plan.seqs[k].seq_id, plan.seqs[k], verified_[k], now);
      else
        process_token(*it->second, sampled[k], std::move(logprobs[k]), now);
    } catch (const std::exception& e) {
      // Detokenizer or stop matching failed: end that request only.
      std::fprintf(stderr, "shardlm engine: request %s failed: %s\n", request_id.c_str(), e.what());
      abort_request(request_id, std::string("internal error while emitting a token: ") + e.what());
    }
  }
  for (const auto& f : failed_requests) {
    const size_t cut = f.find('\n');
    abort_request(f.substr(0, cut), f.substr(cut + 1));
  }
  metrics_.update([&](MetricsSnapshot& m) { m.num_preemptions_total = sched_.stats().n_preemptions; });
  update_gauges();
  return true;
}

void Engine::record_prompt_logprobs(const StepPlan& plan, const std::vector<int64_t>& first_row) {
  // One job per prompt position whose next token is a prompt token: row
  // n_past + i of the chunk predicts prompt token n_past + i + 1.
  struct Job {
    const float* row;       // [vocab]
    int32_t token;          // the prompt token that followed
    int32_t n_top;
    TokenLogprobs* out;
  };
  std::vector<Job> jobs;
  for (size_t k = 0; k < plan.seqs.size(); ++k) {
    const ScheduledSeq& sc = plan.seqs[k];
    if (!sc.all_logits) continue;
    auto live = seqs_.find(sc.seq_id);
    if (live == seqs_.end()) continue;  // aborted while its batch was in flight
    RequestState& rs = *live->second->request;
    const std::vector<int32_t>& prompt = rs.request.prompt_token_ids;
    for (int32_t i = 0; i < sc.n_tokens; ++i) {
      const size_t next = size_t(sc.n_past) + size_t(i) + 1;
      if (next >= prompt.size()) break;  // the last prompt position: sampled, not a prompt logprob
      jobs.push_back({logits_.data() + (first_row[k] + i) * vocab_size_, prompt[next], rs.request.prompt_logprobs,
                      &rs.prompt_logprobs.at(next - 1)});
    }
  }
  const int64_t n_jobs = static_cast<int64_t>(jobs.size());
  const bool parallel = n_jobs > 1 && n_jobs * vocab_size_ >= config_.parallel_sampling_min_work;
#pragma omp parallel if (parallel)
  {
    std::vector<std::pair<float, int32_t>> heap;
    std::vector<int32_t> top_ids;
#pragma omp for schedule(static)
    for (int64_t j = 0; j < n_jobs; ++j) {
      const Job& job = jobs[size_t(j)];
      RowLogprobs lp = row_logprobs(std::span<const float>(job.row, size_t(vocab_size_)), job.token,
                                    size_t(job.n_top), heap, top_ids);
      job.out->token_id = job.token;
      job.out->logprob = lp.logprob;
      job.out->rank = lp.rank;
      job.out->top = std::move(lp.top);
    }
  }
}

void Engine::process_token(SeqState& seq, int32_t token, std::optional<TokenLogprobs> logprobs, Clock::time_point now) {
  RequestState& rs = *seq.request;
  const EngineRequest& r = rs.request;
  seq.output_ids.push_back(token);
  const int32_t n_out = static_cast<int32_t>(seq.output_ids.size());

  const bool first_of_request = !rs.first_token_seen;
  rs.first_token_seen = true;
  const double ttft = std::chrono::duration<double>(now - rs.arrival).count();
  if (first_of_request) rs.ttft_s = ttft;

  SequenceOutput out = make_output(seq);
  out.new_token_ids.push_back(token);
  if (n_out == 1 && seq.index == 0 && r.prompt_logprobs >= 0) out.prompt_logprobs = std::move(rs.prompt_logprobs);
  if (logprobs) out.logprobs.push_back(std::move(*logprobs));
  const bool has_prev = n_out > 1;
  const double itl = has_prev ? std::chrono::duration<double>(now - seq.last_token_time).count() : 0.0;
  seq.last_token_time = now;
  metrics_.update([&](MetricsSnapshot& m) {
    ++m.generation_tokens_total;
    if (first_of_request) {
      m.prompt_tokens_total += static_cast<int64_t>(r.prompt_token_ids.size());
      m.time_to_first_token_seconds.observe(ttft);
    }
    if (has_prev) m.inter_token_latency_seconds.observe(itl);
  });

  bool past_min = n_out >= r.stop.min_tokens;
  bool is_eos = !r.stop.ignore_eos && std::count(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), token);
  const bool is_stop_token = std::count(r.stop.stop_token_ids.begin(), r.stop.stop_token_ids.end(), token) > 0;
  bool grammar_done = false;
  if (seq.matcher) {
    // The mask allowed only what the grammar accepts, so this cannot fail
    // unless a bug let another token through.
    SHARDLM_CHECK(seq.matcher->accept_token(token), "sampled token ", token, " is not allowed by the grammar");
    past_min = true;  // the grammar decides where the output ends
    if (seq.matcher->is_terminated()) {
      grammar_done = true;
      is_eos = is_eos || seq.matcher->grammar().vocabulary().is_stop(token);
    }
  }
  if (past_min && (is_eos || is_stop_token)) {
    // The stop token ends the text without adding to it (vLLM).
    out.finish_reason = FinishReason::kStop;
    out.stop_token_id = token;
  } else if (seq.detok) {
    out.text_delta = seq.stops->push(seq.detok->push(token), past_min);
    if (seq.stops->stopped()) {
      out.finish_reason = FinishReason::kStop;
      out.stop_string = seq.stops->matched();
    }
  }
  if (!out.finished() && grammar_done) out.finish_reason = FinishReason::kStop;  // the grammar is complete
  if (!out.finished() && n_out >= r.stop.max_tokens) out.finish_reason = FinishReason::kLength;
  if (out.finished() && !seq.stops->stopped() && seq.detok) {
    out.text_delta += seq.stops->push(seq.detok->flush(), false);
    out.text_delta += seq.stops->flush();
  }
  if (!out.finished()) {
    seq.pending_mask = nullptr;  // used for this token, if it was there
    defer_mask_if_new(seq);
    emit(rs, out);
    return;
  }
  finish_seq(seq, out);
  emit(rs, out);
  if (out.request_finished) {
    const std::string id = r.request_id;
    for (SeqId sid : rs.seq_ids) seqs_.erase(sid);  // destroys seq
    requests_.erase(id);
    std::lock_guard<std::mutex> lock(mutex_);
    live_ids_.erase(id);
  }
}

void Engine::update_gauges() {
  const SchedulerStats st = sched_.stats();
  metrics_.update([&](MetricsSnapshot& m) {
    m.num_requests_running = st.n_running;
    m.num_requests_waiting = st.n_waiting;
    m.kv_cache_usage_perc = st.kv_usage;
    m.kv_blocks_in_use = st.n_blocks_used;
    m.kv_blocks_in_use_peak = std::max<int64_t>(m.kv_blocks_in_use_peak, st.n_blocks_used);
    m.kv_local_blocks_in_use = st.n_local_blocks_used;
    m.kv_local_blocks_in_use_peak = std::max<int64_t>(m.kv_local_blocks_in_use_peak, st.n_local_blocks_used);
    m.num_preemptions_total = st.n_preemptions;
    m.kv_blocks_slid_total = st.n_blocks_slid;
    m.prefix_cache_queries_total = st.prefix_cache.n_query_tokens;
    m.prefix_cache_hits_total = st.prefix_cache.n_hit_tokens;
  });
}

}  // namespace shardlm
