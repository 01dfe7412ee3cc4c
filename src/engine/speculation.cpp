// Engine's speculative-decoding hooks and verification (engine/speculation.h).
#include "engine/speculation.h"

#include "core/error.h"
#include "engine/engine.h"
#include "model/draft_model.h"

namespace shardlm {

namespace {

// As the engine reports a sampled token: raw logprob, its rank among the
// row's logits (1 = most likely) and the sampler's top alternatives.
TokenLogprobs raw_token_logprobs(SampleResult& res, const float* row, int64_t vocab) {
  TokenLogprobs lp;
  lp.token_id = res.token;
  lp.logprob = res.logprob;
  lp.rank = 1;
  for (int64_t v = 0; v < vocab; ++v) lp.rank += row[v] > row[res.token] ? 1 : 0;
  lp.top = std::move(res.top_logprobs);
  return lp;
}

}  // namespace

size_t grammar_draft_prefix(grammar::GrammarMatcher& matcher, std::span<const int32_t> draft) {
  static thread_local std::vector<uint32_t> mask;
  mask.resize(size_t(matcher.grammar().vocabulary().n_mask_words()));
  size_t n = 0;
  while (n < draft.size() && matcher.accept_token(draft[n])) {
    ++n;
    if (matcher.is_terminated()) break;  // nothing may follow it
    if (!matcher.fill_next_token_bitmask(mask)) {  // a dead end: no token may follow it
      matcher.rollback(1);
      --n;
      break;
    }
  }
  matcher.rollback(static_cast<int32_t>(n));
  return n;
}

VerifiedDraft verify_draft_rows(Sampler& sampler, std::span<const int32_t> draft, const float* rows, int64_t vocab,
                                bool want_logprobs) {
  VerifiedDraft v;
  const size_t d = draft.size();
  for (size_t j = 0; j <= d; ++j) {
    const float* row = rows + int64_t(j) * vocab;
    SampleResult res = sampler.sample(std::span<const float>(row, size_t(vocab)));
    if (want_logprobs) v.logprobs.push_back(raw_token_logprobs(res, row, vocab));
    if (j < d && res.token == draft[j]) {
      ++v.n_accepted;
      continue;
    }
    v.token = res.token;
    break;
  }
  return v;
}

void Engine::propose_drafts(StepPlan& plan) {
  const SpeculativeOptions& so = config_.speculative;
  if (!so.enabled()) return;
  int32_t n_decodes = 0;
  for (const ScheduledSeq& sc : plan.seqs) n_decodes += sc.n_tokens == 1 && sc.need_logits ? 1 : 0;
  if (n_decodes > config_.speculative_max_decodes) return;  // auto-off: a full batch gains nothing
  struct Candidate {
    size_t k;                   // its index in plan.seqs
    grammar::GrammarMatcher* matcher;
    int64_t room;               // drafts it may take
  };
  std::vector<Candidate> candidates;
  for (size_t k = 0; k < plan.seqs.size(); ++k) {
    const ScheduledSeq& sc = plan.seqs[k];
    if (sc.n_tokens != 1 || !sc.need_logits) continue;
    auto live = seqs_.find(sc.seq_id);
    if (live == seqs_.end()) continue;
    SeqState& seq = *live->second;
    const EngineRequest& r = seq.request->request;
    // Structured output: each row gets the mask of its own grammar state
    // (Engine::mask_draft_rows), a walk of the vocabulary per new state, so
    // a grammar whose walks are slow is not drafted for. Below min_tokens
    // each row gets its own bans.
    if (seq.matcher && seq.matcher->grammar().last_walk_ms() >= config_.defer_mask_walk_ms) continue;
    // The fed token is the last output; verifying d drafts may produce d + 1 more.
    const int64_t room = int64_t(r.stop.max_tokens) - int64_t(seq.output_ids.size()) - 1;
    if (room < 1) continue;
    candidates.push_back({k, seq.matcher.get(), std::min<int64_t>(room, so.num_speculative_tokens)});
  }
  if (candidates.empty()) return;
  std::vector<std::vector<int32_t>> drafts(candidates.size());
  if (config_.draft_model) {
    // One batch of draft steps for every candidate (model/draft_model.h).
    std::vector<DraftModel::Query> queries;
    for (const Candidate& c : candidates) {
      const SeqId id = plan.seqs[c.k].seq_id;
      queries.push_back({id, sched_.tokens(id), c.room});
    }
    drafts = config_.draft_model->propose(queries);
  } else {
    for (size_t i = 0; i < candidates.size(); ++i)
      drafts[i] = ngram_draft(sched_.tokens(plan.seqs[candidates[i].k].seq_id), so, candidates[i].room);
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::vector<int32_t>& draft = drafts[i];
    if (candidates[i].matcher) draft.resize(grammar_draft_prefix(*candidates[i].matcher, draft));
    if (!draft.empty()) sched_.add_draft(plan, candidates[i].k, draft);
  }
}

void Engine::emit_verified(SeqId id, const ScheduledSeq& sc, VerifiedDraft& verified, Clock::time_point now) {
  const int32_t a = verified.n_accepted;
  const int32_t d = static_cast<int32_t>(sc.draft_ids.size());
  metrics_.update([&](MetricsSnapshot& m) {
    ++m.spec_decode_num_drafts_total;
    m.spec_decode_num_draft_tokens_total += d;
    m.spec_decode_num_accepted_tokens_total += a;
    auto& per_pos = m.spec_decode_num_accepted_tokens_per_pos_total;
    if (per_pos.size() < size_t(d)) per_pos.resize(size_t(d), 0);
    for (int32_t i = 0; i < a; ++i) ++per_pos[size_t(i)];
  });
  // Token by token, as without speculation; a token that finishes the
  // sequence (EOS, stop string, max_tokens) drops the rest.
  for (int32_t i = 0; i <= a; ++i) {
    auto it = seqs_.find(id);
    if (it == seqs_.end() || it->second->finished) return;
    const int32_t token = i < a ? sc.draft_ids[size_t(i)] : verified.token;
    std::optional<TokenLogprobs> lp;
    if (size_t(i) < verified.logprobs.size()) lp = std::move(verified.logprobs[size_t(i)]);
    process_token(*it->second, token, std::move(lp), now);
  }
}

}  // namespace shardlm
