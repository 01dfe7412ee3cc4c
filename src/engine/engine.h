// The serving engine: one thread owns the scheduler, the KV bookkeeping and
// every live sequence; other threads only post commands (submit, abort) to its
// queue (llama.cpp's server queue). Per step: schedule -> executor.submit
// (repeated while the pipeline has room: micro-batches of disjoint sequences,
// so PP stages all have work) -> collect the oldest batch -> sample each
// sequence that reached its last token -> commit -> stream outputs through
// the request's callbacks.
//
// Threading: submit/abort/stop/metrics are thread-safe. Callbacks run on the
// engine thread. Without start(), drive it yourself with run_step() (tests,
// offline batch runs) from a single thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/arrivals.h"
#include "engine/detokenizer.h"
#include "engine/host_workers.h"
#include "engine/mask_worker.h"
#include "engine/metrics.h"
#include "engine/model_executor.h"
#include "engine/request.h"
#include "engine/speculation.h"
#include "engine/stop_strings.h"
#include "sched/scheduler.h"

namespace shardlm {

class DraftModel;  // model/draft_model.h

// Burst admission: how long the submissions of a burst may pause before the
// engine takes the burst as whole. Measured on a 2-core CPU with 16 clients,
// the gaps between a burst's submissions reached 2.9 ms while the engine was
// computing beside them (README "Performance").
constexpr double kBurstQuietMs = 3.0;

struct EngineConfig {
  SchedulerConfig scheduler;                 // pool size, block size, budgets, max_model_len
  std::vector<int32_t> eos_token_ids;        // end the sequence ("stop") unless ignore_eos
  int32_t max_n = 64;                        // largest accepted EngineRequest::n
  int32_t max_live_requests = 0;             // > 0: submit refuses more (kOutOfMemory -> HTTP 429)
  // Micro-batches in flight at once: 0 = as many as the executor takes (its
  // pipeline depth, PP); 1 = one batch per step (no pipeline overlap).
  int32_t max_batches_in_flight = 0;
  // A broken executor (a rank died) is restarted in place at most this many
  // times over the engine's life; past that, or when it cannot restart, the
  // engine is down for good (health().fatal) and refuses every request.
  int32_t max_executor_restarts = 3;
  // A step's rows are sampled in parallel (OpenMP, one team) when rows x
  // vocab reaches this: a team costs microseconds, a 152K-token row tens to
  // hundreds of them. Tests set 0 to force the parallel path.
  int64_t parallel_sampling_min_work = int64_t(1) << 18;
  // OpenMP threads of the engine thread's own work (sampling, grammar masks,
  // prompt logprobs); 0: OpenMP's default. serve sets 1 when the forward runs
  // on this process's CPU cores: a second OpenMP team, once created, makes
  // libgomp count more threads than CPUs for the rest of the process and cut
  // every spin-wait of the forward's team to 100 turns (its "throttled" spin),
  // so each of a decode step's few hundred barriers sleeps in the kernel.
  int32_t host_threads = 0;
  // Plain threads (engine/host_workers.h) beside the engine thread that
  // sample a step's rows with it, where host_threads = 1 keeps OpenMP out:
  // serve on the CPU with PP = 1 sets the cores less one, since the ranks'
  // cores are idle while the engine samples. 0: the OpenMP loop.
  int32_t host_workers = 0;
  // > 0: SchedulerConfig::max_prompt_logit_rows becomes this many bytes of
  // f32 logit rows (at least 1 row, at most max_num_batched_tokens): 64 MiB
  // is 110 positions of a 152K vocabulary per step. 0: the scheduler's value.
  int64_t prompt_logits_bytes = int64_t(64) << 20;
  // A new grammar state's mask goes to the mask worker (its sequence waits)
  // when the grammar's last walk over the vocabulary took at least this
  // long; cheaper ones (a JSON schema's: under a millisecond over 152K
  // tokens) are walked in the step, as waiting a step would cost more.
  // Tests set 0 to send every new state to the worker.
  double defer_mask_walk_ms = 5.0;
  // Tests: runs on the grammar mask worker before each job (engine/mask_worker.h),
  // so that a test can hold a mask back and watch the other sequences step on.
  std::function<void()> before_mask_job;
  // n-gram speculative decoding (--speculative-config; engine/speculation.h).
  // Greedy tokens equal decoding without it only when the executor runs the
  // batch-invariant kernels (serve turns them on with it).
  SpeculativeOptions speculative;
  // Auto-off: a step holding more than this many decoding sequences drafts
  // nothing (verification rows cost more than they save in a full batch;
  // README "Speculative decoding" has the measurement behind the default).
  int32_t speculative_max_decodes = kDefaultSpeculativeMaxDecodes;
  // The draft that proposes when speculative.uses_draft_model() (serve builds
  // one per replica on its own backend; model/draft_model.h). The engine
  // thread runs it between steps and frees a sequence's draft KV when the
  // sequence finishes.
  std::shared_ptr<DraftModel> draft_model;
  // Burst admission (engine/arrivals.h). When the loop wakes from idle to
  // new submissions, it holds them while `arrivals` announces requests not
  // yet submitted and, once two or more are in, until none has come for
  // kBurstQuietMs; never past burst_window_ms after the first submission.
  // A lone request on an idle engine is not held. No arrivals or 0: off.
  std::shared_ptr<Arrivals> arrivals;
  double burst_window_ms = 0;
  // Unset: the standard Sampler. Tests substitute one that throws.
  std::function<std::unique_ptr<Sampler>(const SamplingParams& params, std::span<const int32_t> prompt_ids,
                                         int64_t vocab_size)>
      make_sampler;
};

// Whether the engine can serve. Thread-safe snapshot (Engine::health).
struct EngineHealth {
  bool ok = true;              // false while the executor is down or restarting
  bool fatal = false;          // down for good: the process should exit and be restarted
  std::string error;           // why it is down, naming the rank: empty when ok
  int32_t n_failures = 0;      // executor failures that broke it
  int32_t n_restarts = 0;      // successful in-place restarts
  double last_recovery_s = 0;  // failure seen -> executor serving again, of the last restart
};

class Engine {
 public:
  // executor and detokenizer must outlive the engine; detokenizer may be null
  // (no text: text_delta stays empty and stop strings are refused).
  Engine(const EngineConfig& config, ModelExecutor& executor, const Detokenizer* detokenizer = nullptr);
  ~Engine();  // stop(/*drain=*/false)
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates on the caller's thread and queues. Throws shardlm::Error
  // (kInvalidArgument with the numbers: too long for max_model_len or the KV
  // pool, bad sampling values, token ids outside the vocabulary, a request_id
  // already live; kOutOfMemory when max_live_requests are in flight;
  // kUnsupported after stop()).
  void submit(EngineRequest request, RequestCallbacks callbacks);
  // Ends every sequence of the request at the engine's next turn, frees its
  // KV blocks, and sends a last output with finish_reason kAbort. Unknown or
  // finished ids are ignored (the client may disconnect after the end).
  void abort(const std::string& request_id);

  void start();                   // runs the loop on its own thread
  // Stops accepting requests; drain: finish everything in flight, else abort
  // it all; then the loop exits (joined here). Idempotent.
  void stop(bool drain = true);

  // Single-threaded driving (only when start() was not called): handles
  // queued commands and runs one step. Returns false when there was nothing
  // to do.
  bool run_step();
  void run_until_idle();

  EngineHealth health() const;

  const Metrics& metrics() const { return metrics_; }
  std::string render_metrics(const std::string& model_name = "") const {
    return metrics_.render_prometheus(model_name);
  }
  const EngineConfig& config() const { return config_; }
  int64_t vocab_size() const { return vocab_size_; }
  // Engine-thread only (or when not started): for tests and debugging.
  const Scheduler& scheduler() const { return sched_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct RequestState;
  struct SeqState {
    RequestState* request = nullptr;
    int32_t index = 0;
    SeqId id = 0;
    std::unique_ptr<Sampler> sampler;        // penalties' token counts and the sequence's RNG
    std::vector<int32_t> output_ids;
    std::unique_ptr<DetokenizerStream> detok;
    std::unique_ptr<StopStringMatcher> stops;
    std::unique_ptr<grammar::GrammarMatcher> matcher;  // structured output, else null
    // The next mask, computed off the engine thread; the sequence is held
    // out of plans until it is done (engine/mask_worker.h).
    std::shared_ptr<PendingMask> pending_mask;
    Clock::time_point last_token_time;
    bool finished = false;
    ~SeqState() {
      if (pending_mask) pending_mask->cancelled = true;
    }
  };
  struct RequestState {
    EngineRequest request;
    RequestCallbacks callbacks;
    Clock::time_point arrival;
    bool first_token_seen = false;
    double ttft_s = -1.0;
    int32_t n_unfinished = 0;
    std::vector<SeqId> seq_ids;
    // [n_prompt - 1] when request.prompt_logprobs >= 0: filled as prefill
    // chunks land (a recomputed chunk writes the same values again), moved
    // into sequence 0's first output.
    std::vector<TokenLogprobs> prompt_logprobs;
  };
  struct Command {
    enum class Kind { kSubmit, kAbort } kind = Kind::kSubmit;
    EngineRequest request;             // kSubmit
    RequestCallbacks callbacks;        // kSubmit
    std::string request_id;            // kAbort
    Clock::time_point time;
  };

  void validate(const EngineRequest& request) const;
  void loop();
  // Burst admission (EngineConfig::arrivals): the loop woke idle; holds the
  // queued submissions while more are on their way. Engine lock held.
  void gather_burst(std::unique_lock<std::mutex>& lock);
  void drain_queue();
  void add_request(Command&& cmd);
  void abort_request(const std::string& request_id, const std::string& error);
  void abort_all(const std::string& error);
  bool step_inner();
  // The prompt logprobs of plan's all_logits chunks, from their logit rows
  // (first_row[k]: plan.seqs[k]'s first row in logits_) into their requests.
  void record_prompt_logprobs(const StepPlan& plan, const std::vector<int64_t>& first_row);
  // After a token: a constrained sequence whose next mask is not cached is
  // held while the mask worker computes it.
  void defer_mask_if_new(SeqState& seq);
  // Releases the held sequences whose masks are done.
  void release_ready_masks();
  // run_until_idle when every runnable sequence is held: waits for a mask.
  void wait_for_masks();
  bool idle() const { return sched_.idle() && in_flight_.empty(); }
  // Ends the requests of a plan that failed to run (their KV is in doubt).
  void fail_plan(const StepPlan& plan, const std::exception& e);
  // After submit/collect threw on `plan` (already off in_flight_): a broken
  // executor fails every request and is restarted; else only plan's requests.
  void executor_failed(const StepPlan& plan, const std::exception& e);
  void process_token(SeqState& seq, int32_t token, std::optional<TokenLogprobs> logprobs, Clock::time_point now);
  // Speculation (engine/speculation.cpp): drafts for the decodes of a new
  // plan; then the verified tokens of plan.seqs[k], each through process_token.
  void propose_drafts(StepPlan& plan);
  // Structured output with drafts: the grammar masks of rows 1..d of a
  // drafted sequence whose first row (first_row in logits_) is masked as usual.
  void mask_draft_rows(std::span<const int32_t> draft, grammar::GrammarMatcher& matcher, int64_t first_row);
  void emit_verified(SeqId id, const ScheduledSeq& sc, VerifiedDraft& verified, Clock::time_point now);
  void finish_seq(SeqState& seq, SequenceOutput& out);
  void emit(RequestState& request, const SequenceOutput& out);
  SequenceOutput make_output(const SeqState& seq) const;
  void update_gauges();

  EngineConfig config_;
  ModelExecutor& executor_;
  const Detokenizer* detokenizer_;
  int64_t vocab_size_;

  // Engine-thread state.
  Scheduler sched_;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::unordered_map<SeqId, std::unique_ptr<SeqState>> seqs_;
  SeqId next_seq_id_ = 1;
  std::vector<float> logits_;  // [n_logits, vocab]
  std::vector<uint32_t> masks_;  // [n_logits, n_mask_words]: grammar bitmasks of this step
  // One row to sample this step (reused across steps: no allocation once grown).
  struct SampleJob {
    size_t k;                  // index in the plan's seqs
    float* logits;             // [vocab] the row in logits_, masked and banned
    SeqState* seq;
    std::exception_ptr error;  // what its sampler threw
  };
  std::vector<SampleJob> sample_jobs_;
  // Per sequence of the step's plan: its first row in logits_, and the row it
  // samples from (its chunk's last; -1: none). Reused across steps.
  std::vector<int64_t> first_row_, sample_row_;
  std::vector<VerifiedDraft> verified_;  // [plan.seqs] this step's verification of each sequence with drafts
  std::vector<int32_t> n_accepted_;      // [plan.seqs] drafts accepted (Scheduler::commit)
  std::deque<StepPlan> in_flight_;  // submitted to the executor, oldest first
  int max_in_flight_ = 1;

  // Shared with submitting threads.
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Command> queue_;
  std::unordered_set<std::string> live_ids_;
  bool stop_requested_ = false;
  bool drain_ = true;
  EngineHealth health_;

  std::thread thread_;
  Metrics metrics_;
  // Engine-thread state for held sequences; masks_done_ is shared with the
  // mask worker (under mutex_).
  std::vector<SeqId> held_;
  bool waiting_for_masks_ = false;  // the last step could schedule nothing: all held
  bool masks_done_ = false;
  int arrivals_listener_ = 0;  // config_.arrivals->add_listener's id (0: none)
  // Last: destroyed first, so its thread's on_done never outlives mutex_.
  MaskWorker mask_worker_;
  HostWorkers host_workers_;  // EngineConfig::host_workers threads (none by default)
};

}  // namespace shardlm
