#include "sched/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace shardlm {

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), pool_(config.n_blocks, config.block_size, config.enable_prefix_caching) {
  if (config.local_sliding_window < 0 || config.n_local_blocks < 0)
    fail(ErrorCode::kInvalidArgument, "local_sliding_window (", config.local_sliding_window, ") and n_local_blocks (",
         config.n_local_blocks, ") must be >= 0 (0: no local-layer pool)");
  if ((config.local_sliding_window > 0) != (config.n_local_blocks > 0))
    fail(ErrorCode::kInvalidArgument, "a local-layer KV pool needs both local_sliding_window (",
         config.local_sliding_window, ") and n_local_blocks (", config.n_local_blocks, ") > 0, or both 0");
  if (config.local_sliding_window > 0 && config.sliding_window > 0)
    fail(ErrorCode::kInvalidArgument, "sliding_window (", config.sliding_window,
         ": every layer slides) and local_sliding_window (", config.local_sliding_window,
         ": local layers in a pool of their own) exclude each other; set one");
  if (config.local_sliding_window > 0)
    local_pool_.emplace(config.n_local_blocks, config.block_size, config.enable_prefix_caching);
  if (config.max_num_seqs < 1)
    fail(ErrorCode::kInvalidArgument, "--max-num-seqs must be >= 1, got ", config.max_num_seqs);
  if (config.max_num_batched_tokens < 1)
    fail(ErrorCode::kInvalidArgument, "--max-num-batched-tokens must be >= 1, got ",
         config.max_num_batched_tokens);
  if (config.max_prompt_logit_rows < 1)
    fail(ErrorCode::kInvalidArgument, "max_prompt_logit_rows must be >= 1, got ", config.max_prompt_logit_rows);
  if (config.max_model_len < 1)
    fail(ErrorCode::kInvalidArgument, "--max-model-len must be >= 1, got ", config.max_model_len);
  if (config.sliding_window < 0)
    fail(ErrorCode::kInvalidArgument, "sliding_window must be >= 0 (0: no window), got ", config.sliding_window);
  if (!config.enable_chunked_prefill && config.max_num_batched_tokens < config.max_model_len)
    fail(ErrorCode::kInvalidArgument, "without chunked prefill --max-num-batched-tokens (",
         config.max_num_batched_tokens, ") must be >= --max-model-len (", config.max_model_len,
         "), or a long prompt could never be scheduled; raise it or enable chunked prefill");
}

void Scheduler::check_fits(const SchedulerConfig& config, int32_t n_prompt, int32_t max_new_tokens) {
  if (n_prompt < 1) fail(ErrorCode::kInvalidArgument, "the prompt is empty: at least 1 token is required");
  if (max_new_tokens < 1)
    fail(ErrorCode::kInvalidArgument, "max_tokens must be >= 1, got ", max_new_tokens);
  const int64_t n_total = int64_t(n_prompt) + max_new_tokens;
  if (n_total > config.max_model_len)
    fail(ErrorCode::kInvalidArgument, "this request needs ", n_total, " tokens (", n_prompt,
         " prompt + ", max_new_tokens, " max_tokens) but the maximum context length is ",
         config.max_model_len, " tokens; shorten the prompt or lower max_tokens");
  // The last generated token is never fed back, so its KV is never stored.
  const int64_t n_blocks =
      max_blocks_held(n_total - 1, config.block_size, config.sliding_window, config.max_num_batched_tokens);
  if (n_blocks > config.n_blocks)
    fail(ErrorCode::kInvalidArgument, "this request needs ", n_blocks, " KV blocks of ", config.block_size,
         " tokens (", n_prompt, " prompt + ", max_new_tokens, " max_tokens",
         config.sliding_window > 0 ? str_cat("; a sliding window of ", config.sliding_window,
                                             " positions and chunks of up to ", config.max_num_batched_tokens)
                                   : std::string(),
         ") but the whole KV cache has ", config.n_blocks, " blocks (", int64_t(config.n_blocks) * config.block_size,
         " tokens); shorten the request or give the KV cache more memory");
  if (config.local_sliding_window == 0) return;
  const int64_t n_local = max_blocks_held(n_total - 1, config.block_size, config.local_sliding_window,
                                          config.max_num_batched_tokens);
  if (n_local > config.n_local_blocks)
    fail(ErrorCode::kInvalidArgument, "this request needs ", n_local, " KV blocks of ", config.block_size,
         " tokens in the local layers' pool (", n_prompt, " prompt + ", max_new_tokens,
         " max_tokens; a sliding window of ", config.local_sliding_window, " positions and chunks of up to ",
         config.max_num_batched_tokens, ") but that pool has ", config.n_local_blocks,
         " blocks; shorten the request, lower --max-num-batched-tokens or give the KV cache more memory");
}

void Scheduler::add(SeqId id, std::vector<int32_t> prompt, int32_t max_new_tokens, SeqId after, BlockHash cache_root,
                    bool prompt_logits) {
  check_fits(config_, static_cast<int32_t>(prompt.size()), max_new_tokens);
  if (seqs_.count(id)) fail(ErrorCode::kInvalidArgument, "sequence id ", id, " is already scheduled");
  auto s = std::make_unique<Seq>();
  s->id = id;
  s->n_prompt = static_cast<int32_t>(prompt.size());
  s->tokens = std::move(prompt);
  s->max_new_tokens = max_new_tokens;
  s->after = after;
  s->long_context = config_.long_context_after > 0 && s->n_prompt > config_.long_context_after;
  s->cache_root = s->long_context ? long_context_root(cache_root) : cache_root;
  s->prompt_logits = prompt_logits;
  seqs_.emplace(id, std::move(s));
  waiting_.push_back(id);
}

Scheduler::Seq& Scheduler::get(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) fail(ErrorCode::kNotFound, "scheduler: unknown sequence id ", id);
  return *it->second;
}

const Scheduler::Seq& Scheduler::get(SeqId id) const {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) fail(ErrorCode::kNotFound, "scheduler: unknown sequence id ", id);
  return *it->second;
}

bool Scheduler::blocked_by_sibling(const Seq& s) const {
  if (s.after < 0 || !config_.enable_prefix_caching) return false;
  auto it = seqs_.find(s.after);
  if (it == seqs_.end()) return false;
  return it->second->n_computed < it->second->n_prompt;
}

ScheduledSeq Scheduler::make_scheduled(const Seq& s, int32_t n_new, bool first) const {
  ScheduledSeq sc;
  sc.seq_id = s.id;
  sc.n_past = s.n_computed;
  sc.n_tokens = n_new;
  sc.token_ids.assign(s.tokens.begin() + s.n_computed, s.tokens.begin() + s.n_computed + n_new);
  sc.block_table = s.table.blocks;
  sc.local_block_table = s.local.blocks;
  sc.need_logits = s.n_computed + n_new == static_cast<int32_t>(s.tokens.size());
  sc.first_chunk = first;
  sc.all_logits = s.prompt_logits;
  sc.long_context = s.long_context;
  return sc;
}

int32_t Scheduler::cap_logit_rows(const Seq& s, int32_t n_new, int32_t* rows_left) {
  if (!s.prompt_logits) return n_new;
  n_new = std::min(n_new, *rows_left);
  *rows_left -= n_new;
  return n_new;
}

void Scheduler::preempt(Seq& s, StepPlan& plan) {
  SHARDLM_CHECK(!s.in_flight, "sequence ", s.id, " is in flight and cannot be preempted");
  auto pos = std::find(running_.begin(), running_.end(), s.id);
  SHARDLM_CHECK(pos != running_.end());
  running_.erase(pos);
  for (int32_t b : s.table.blocks)
    if (b != kNoBlock) plan.freed_blocks.push_back(b);
  free_tables(s);
  // Recompute: prompt + generated so far become the tokens to compute again.
  s.n_computed = 0;
  s.status = SeqStatus::kWaiting;
  ++s.n_preemptions;
  ++n_preemptions_;
  waiting_.push_front(s.id);
  plan.preempted.push_back(s.id);
}

StepPlan Scheduler::schedule(int32_t max_seqs) {
  StepPlan plan;
  int32_t budget = config_.max_num_batched_tokens;
  int32_t logit_rows_left = config_.max_prompt_logit_rows;
  const size_t seq_cap = static_cast<size_t>(max_seqs > 0 ? max_seqs : config_.max_num_seqs);

  // Running sequences first, oldest first, skipping those in flight; when
  // blocks run out, the newest running sequence not in flight is preempted
  // (possibly the one being scheduled: it is the last candidate).
  for (size_t i = 0; i < running_.size() && budget > 0 && plan.seqs.size() < seq_cap;) {
    Seq& s = get(running_[i]);
    if (s.in_flight || s.held) {
      ++i;
      continue;
    }
    const int32_t n_left = static_cast<int32_t>(s.tokens.size()) - s.n_computed;
    SHARDLM_CHECK(n_left > 0, "running sequence ", s.id, " has nothing to compute");
    const int32_t n_rows_before = logit_rows_left;
    const int32_t n_new = cap_logit_rows(s, std::min(n_left, budget), &logit_rows_left);
    if (n_new == 0) {  // this step's prompt-logit rows are taken
      ++i;
      continue;
    }
    slide_window(s);  // normally done at commit already; a no-op then
    bool ok = false;
    while (!(ok = allocate(s, s.n_computed + n_new))) {
      size_t v = running_.size() - 1;
      while (v > i && get(running_[v]).in_flight) --v;
      const SeqId victim = running_[v];
      preempt(get(victim), plan);
      if (victim == s.id) break;
    }
    if (!ok) {
      logit_rows_left = n_rows_before;
      break;  // s was the newest candidate: nothing after it can run
    }
    plan.seqs.push_back(make_scheduled(s, n_new, false));
    s.in_flight = true;
    budget -= n_new;
    ++i;
  }

  // Then waiting sequences in FCFS order, unless this step had to preempt.
  if (plan.preempted.empty()) {
    for (auto it = waiting_.begin(); it != waiting_.end() && budget > 0 && plan.seqs.size() < seq_cap &&
                                     static_cast<int32_t>(running_.size()) < config_.max_num_seqs;) {
      Seq& s = get(*it);
      if (blocked_by_sibling(s) || s.held) {
        ++it;
        continue;
      }
      PrefixMatch match;
      // A sequence that wants its prompt's logits computes every position.
      if (s.n_computed == 0 && !s.prompt_logits) match = find_cached_prefix(pool_, s.tokens, s.cache_root);
      // Hybrid: the hit is cut to what the local pool still holds of its window.
      PrefixMatch local_match;
      if (local_pool_ && !match.blocks.empty()) {
        local_match = find_window_prefix(*local_pool_, match, s.tokens, config_.local_sliding_window, s.cache_root);
        match.blocks.resize(local_match.blocks.size());
        match.hashes.resize(local_match.hashes.size());
        match.n_tokens = local_match.n_tokens;
      }
      const int32_t n_total = static_cast<int32_t>(s.tokens.size());
      int32_t n_new = n_total - match.n_tokens;
      // Prompt logprobs are chunked by their row cap even without chunked prefill.
      if (!config_.enable_chunked_prefill && n_new > budget && !s.prompt_logits) break;
      const int32_t n_rows_before = logit_rows_left;
      n_new = cap_logit_rows(s, std::min(n_new, budget), &logit_rows_left);
      if (n_new == 0) {  // this step's prompt-logit rows are taken: admit it later
        ++it;
        continue;
      }
      if (!allocate(s, match.n_tokens + n_new, &match, &local_match)) {
        logit_rows_left = n_rows_before;
        break;
      }
      if (!s.admitted_once) {
        pool_.record_lookup(n_total, match.n_tokens);
        s.n_prefix_hit = match.n_tokens;
        s.admitted_once = true;
      }
      s.n_computed = match.n_tokens;
      s.status = SeqStatus::kRunning;
      running_.push_back(s.id);
      plan.seqs.push_back(make_scheduled(s, n_new, true));
      s.in_flight = true;
      budget -= n_new;
      it = waiting_.erase(it);
    }
  }
  plan.n_scheduled_tokens = config_.max_num_batched_tokens - budget;
  return plan;
}

int32_t Scheduler::add_draft(StepPlan& plan, size_t k, std::span<const int32_t> draft) {
  SHARDLM_CHECK(k < plan.seqs.size());
  ScheduledSeq& sc = plan.seqs[k];
  Seq& s = get(sc.seq_id);
  if (draft.empty() || sc.n_tokens != 1 || !sc.need_logits || !sc.draft_ids.empty()) return 0;
  const int32_t n_tokens = static_cast<int32_t>(s.tokens.size());
  // Verifying d drafts may produce d + 1 tokens; the drafts sit at positions n_tokens .. n_tokens + d - 1.
  const int32_t n_generated = n_tokens - s.n_prompt;
  int32_t n = static_cast<int32_t>(draft.size());
  n = std::min(n, config_.max_num_batched_tokens - plan.n_scheduled_tokens);
  n = std::min(n, s.max_new_tokens - n_generated - 1);
  n = std::min(n, config_.max_model_len - n_tokens);
  for (; n > 0; --n)
    if (allocate(s, s.n_computed + 1 + n)) break;
  if (n <= 0) return 0;
  sc.draft_ids.assign(draft.begin(), draft.begin() + n);
  sc.block_table = s.table.blocks;
  sc.local_block_table = s.local.blocks;
  plan.n_scheduled_tokens += n;
  return n;
}

void Scheduler::slide_window(Seq& s) {
  if (config_.sliding_window > 0)
    n_blocks_slid_ += static_cast<int64_t>(
        release_before(pool_, s.table, first_position_read(s.n_computed, config_.sliding_window)).size());
  if (local_pool_)
    n_blocks_slid_ += static_cast<int64_t>(
        release_before(*local_pool_, s.local, first_position_read(s.n_computed, config_.local_sliding_window))
            .size());
}

bool Scheduler::allocate(Seq& s, int32_t n_total_slots, const PrefixMatch* match, const PrefixMatch* local_match) {
  const int32_t kept = match ? first_position_read(match->n_tokens, config_.sliding_window) : 0;
  if (!local_pool_) return allocate_slots(pool_, s.table, n_total_slots, match, kept);
  const int32_t local_kept =
      local_match ? first_position_read(local_match->n_tokens, config_.local_sliding_window) : 0;
  SHARDLM_CHECK(!match || !local_match || match->n_tokens == local_match->n_tokens, "seq ", s.id, ": hit ",
                match->n_tokens, " global vs ", local_match->n_tokens, " local tokens");
  // Check both pools first, so a pool that is short leaves the other untouched.
  if (n_free_blocks_needed(pool_, s.table, n_total_slots, match, kept) > pool_.n_free() ||
      n_free_blocks_needed(*local_pool_, s.local, n_total_slots, local_match, local_kept) > local_pool_->n_free())
    return false;
  const bool ok = allocate_slots(pool_, s.table, n_total_slots, match, kept) &&
                  allocate_slots(*local_pool_, s.local, n_total_slots, local_match, local_kept);
  SHARDLM_CHECK(ok, "seq ", s.id, ": allocation failed after its check");
  return true;
}

void Scheduler::free_tables(Seq& s) {
  free_table(pool_, s.table);
  if (local_pool_) free_table(*local_pool_, s.local);
}

void Scheduler::drop_draft_blocks(Seq& s) {
  // Keep the slots of every token but the last (computed) and the last's (computed next).
  truncate_table(pool_, s.table, static_cast<int32_t>(s.tokens.size()));
  if (local_pool_) truncate_table(*local_pool_, s.local, static_cast<int32_t>(s.tokens.size()));
}

void Scheduler::commit(const StepPlan& plan, std::span<const int32_t> sampled, std::span<const int32_t> n_accepted) {
  SHARDLM_CHECK(sampled.size() == plan.seqs.size(), "sampled ", sampled.size(), " for ", plan.seqs.size(), " seqs");
  SHARDLM_CHECK(n_accepted.empty() || n_accepted.size() == plan.seqs.size(), "n_accepted ", n_accepted.size(),
                " for ", plan.seqs.size(), " seqs");
  for (size_t k = 0; k < plan.seqs.size(); ++k) {
    const ScheduledSeq& sc = plan.seqs[k];
    end_flight(sc);
    auto it = seqs_.find(sc.seq_id);
    if (it == seqs_.end() || it->second->status != SeqStatus::kRunning) continue;
    Seq& s = *it->second;
    SHARDLM_CHECK(s.n_computed == sc.n_past, "seq ", s.id, " computed ", s.n_computed, " plan n_past ", sc.n_past);
    // Drafts: the fed token and the accepted drafts hold valid KV; the rows after them are rolled back.
    const int32_t n_draft = static_cast<int32_t>(sc.draft_ids.size());
    const int32_t accepted = n_draft > 0 && !n_accepted.empty() && sampled[k] >= 0 ? n_accepted[k] : 0;
    SHARDLM_CHECK(accepted >= 0 && accepted <= n_draft, "seq ", s.id, ": ", accepted, " of ", n_draft,
                  " drafts accepted");
    s.tokens.insert(s.tokens.end(), sc.draft_ids.begin(), sc.draft_ids.begin() + accepted);
    s.n_computed += sc.n_tokens + accepted;
    if (s.n_computed >= s.n_prompt) s.prompt_logits = false;  // every prompt position's logits came back
    register_computed(pool_, s.table, s.tokens, s.n_computed, s.cache_root);
    if (local_pool_) register_computed(*local_pool_, s.local, s.tokens, s.n_computed, s.cache_root);
    if (sampled[k] >= 0) {
      SHARDLM_CHECK(sc.need_logits, "token sampled for seq ", s.id, " without logits");
      s.tokens.push_back(sampled[k]);
    }
    if (n_draft > 0) drop_draft_blocks(s);
    // After registering: a block leaving the window stays cached (evictable).
    slide_window(s);
  }
}

void Scheduler::end_flight(const ScheduledSeq& sc) {
  if (auto f = finishing_.find(sc.seq_id); f != finishing_.end()) {
    free_tables(*f->second);
    finishing_.erase(f);
    return;
  }
  if (auto it = seqs_.find(sc.seq_id); it != seqs_.end()) it->second->in_flight = false;
}

void Scheduler::release(const StepPlan& plan) {
  for (const ScheduledSeq& sc : plan.seqs) {
    end_flight(sc);
    if (auto it = seqs_.find(sc.seq_id); !sc.draft_ids.empty() && it != seqs_.end()) drop_draft_blocks(*it->second);
  }
}

void Scheduler::finish(SeqId id) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return;
  Seq& s = *it->second;
  if (s.status == SeqStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), id));
  } else {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
  }
  if (s.in_flight) {
    s.status = SeqStatus::kFinished;
    finishing_.emplace(id, std::move(it->second));
  } else {
    free_tables(s);
  }
  seqs_.erase(it);
}

void Scheduler::set_held(SeqId id, bool held) {
  if (auto it = seqs_.find(id); it != seqs_.end()) it->second->held = held;
}

int32_t Scheduler::n_in_flight() const {
  int32_t n = 0;
  for (SeqId id : running_) n += get(id).in_flight ? 1 : 0;
  return n;
}

bool Scheduler::in_flight(SeqId id) const {
  auto it = seqs_.find(id);
  return it != seqs_.end() && it->second->in_flight;
}

SeqStatus Scheduler::status(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? SeqStatus::kFinished : it->second->status;
}

std::span<const int32_t> Scheduler::tokens(SeqId id) const { return get(id).tokens; }
int32_t Scheduler::n_computed(SeqId id) const { return get(id).n_computed; }
int32_t Scheduler::n_prefix_hit_tokens(SeqId id) const { return get(id).n_prefix_hit; }
int32_t Scheduler::n_preemptions(SeqId id) const { return get(id).n_preemptions; }

SchedulerStats Scheduler::stats() const {
  SchedulerStats st;
  st.n_running = n_running();
  st.n_waiting = n_waiting();
  st.n_preemptions = n_preemptions_;
  // The fuller pool: either one running out stops admission (a hybrid model's
  // local pool is sized apart from the global one).
  st.kv_usage = std::max(pool_.usage(), local_pool_ ? local_pool_->usage() : 0.0);
  st.n_blocks_used = pool_.n_used();
  st.n_blocks_slid = n_blocks_slid_;
  st.n_local_blocks_used = local_pool_ ? local_pool_->n_used() : 0;
  st.prefix_cache = pool_.stats();
  return st;
}

}  // namespace shardlm
