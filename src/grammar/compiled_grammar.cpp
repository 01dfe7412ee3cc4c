#include "grammar/compiled_grammar.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <numeric>
#include <thread>

#include "core/error.h"

namespace shardlm::grammar {
namespace {
constexpr int32_t kUnknown = -2;
}

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> stop_ids)
    : bytes_(std::move(token_bytes)), stop_ids_(std::move(stop_ids)) {
  for (int32_t s : stop_ids_)
    if (s < 0 || s >= size())
      fail(ErrorCode::kInvalidArgument, "grammar vocabulary: stop token id ", s, " is outside [0, ", size(), ")");
  for (int32_t id = 0; id < size(); ++id)
    if (!bytes_[size_t(id)].empty() && !is_stop(id)) sorted_.push_back(id);
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
  lcp_.assign(sorted_.size(), 0);
  for (size_t i = 0; i < sorted_.size(); ++i) {
    const std::string& cur = bytes_[size_t(sorted_[i])];
    max_len_ = std::max(max_len_, cur.size());
    if (i == 0) continue;
    const std::string& prev = bytes_[size_t(sorted_[i - 1])];
    size_t n = 0;
    while (n < cur.size() && n < prev.size() && cur[n] == prev[n]) ++n;
    lcp_[i] = static_cast<int32_t>(n);
  }
}

bool TokenVocabulary::is_stop(int32_t id) const {
  return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
}

CompiledGrammar::CompiledGrammar(Nfa nfa, std::shared_ptr<const TokenVocabulary> vocab, std::string description,
                                 size_t max_table_bytes)
    : nfa_(std::move(nfa)), vocab_(std::move(vocab)), description_(std::move(description)),
      max_table_bytes_(max_table_bytes) {
  SHARDLM_CHECK(vocab_ != nullptr);
  nfa_bytes_ = nfa_.n_states() * (2 * sizeof(std::vector<int32_t>) + 2 * sizeof(uint8_t) + sizeof(uint32_t));
  for (size_t s = 0; s < nfa_.n_states(); ++s)
    nfa_bytes_ += nfa_.edges[s].capacity() * sizeof(NfaEdge) + nfa_.eps[s].capacity() * sizeof(int32_t);
  keep_.assign(nfa_.n_states(), 0);
  visited_.assign(nfa_.n_states(), 0u);
  for (size_t s = 0; s < nfa_.n_states(); ++s)
    keep_[s] = !nfa_.edges[s].empty() || int32_t(s) == nfa_.accept;
  std::vector<int32_t> start = {nfa_.start};
  closure(&start);
  std::lock_guard<std::mutex> lock(mutex_);
  SHARDLM_CHECK(intern_locked(std::move(start)) == 0);
}

// Epsilon closure, keeping only the states that matter for matching.
void CompiledGrammar::closure(std::vector<int32_t>* set) const {
  std::vector<int32_t> stack = *set, out;
  if (++stamp_ == 0) {  // wrapped: forget every old mark
    std::fill(visited_.begin(), visited_.end(), 0u);
    stamp_ = 1;
  }
  while (!stack.empty()) {
    const int32_t s = stack.back();
    stack.pop_back();
    if (visited_[size_t(s)] == stamp_) continue;
    visited_[size_t(s)] = stamp_;
    if (keep_[size_t(s)]) out.push_back(s);
    for (int32_t t : nfa_.eps[size_t(s)]) stack.push_back(t);
  }
  std::sort(out.begin(), out.end());
  *set = std::move(out);
}

int32_t CompiledGrammar::intern_locked(std::vector<int32_t> set) const {
  if (set.empty()) return kDeadState;
  auto it = index_.find(set);
  if (it != index_.end()) return it->second;
  if (sets_.size() >= kMaxDfaStates)
    fail(ErrorCode::kUnsupported, "grammar (", description_, ") needs more than ", kMaxDfaStates,
         " automaton states; simplify it");
  // The set is held twice (sets_ and index_'s key), with a map node and a
  // transition row of 256 ids.
  const size_t cost = 2 * set.size() * sizeof(int32_t) + 256 * sizeof(int32_t) + 128;
  if (table_bytes_ + cost > max_table_bytes_)
    fail(ErrorCode::kUnsupported, "grammar (", description_, ") needs more than ",
         max_table_bytes_ >= (size_t(1) << 20) ? str_cat(max_table_bytes_ >> 20, " MiB") : str_cat(max_table_bytes_, " bytes"),
         " of automaton tables (the grammar table budget, serve --grammar-table-memory): ", sets_.size(), " states so far, the last tracking ",
         set.size(), " positions at once; simplify it (nested or stacked bounded repetitions such as (.{1,50}){30,80} "
         "grow with every byte)");
  table_bytes_ += cost;
  const int32_t id = static_cast<int32_t>(sets_.size());
  accepting_.push_back(std::binary_search(set.begin(), set.end(), nfa_.accept) ? 1 : 0);
  continues_.push_back(-1);
  trans_.resize(trans_.size() + 256, kUnknown);
  index_.emplace(set, id);
  sets_.push_back(std::move(set));
  return id;
}

int32_t CompiledGrammar::step_locked(int32_t state, uint8_t byte) const {
  int32_t& slot = trans_[size_t(state) * 256 + byte];
  if (slot != kUnknown) return slot;
  std::vector<int32_t> next;
  for (int32_t s : sets_[size_t(state)])
    for (const NfaEdge& e : nfa_.edges[size_t(s)])
      if (e.bytes.has(byte)) next.push_back(e.to);
  closure(&next);
  const int32_t id = intern_locked(std::move(next));  // may grow trans_: re-index
  trans_[size_t(state) * 256 + byte] = id;
  return id;
}

int32_t CompiledGrammar::step_bytes(int32_t state, std::string_view bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (char c : bytes) {
    if (state < 0) return kDeadState;
    state = step_locked(state, uint8_t(c));
  }
  return state;
}

bool CompiledGrammar::is_accepting(int32_t state) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state >= 0 && accepting_[size_t(state)];
}

bool CompiledGrammar::can_continue(int32_t state) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state < 0) return false;
  if (continues_[size_t(state)] < 0) {
    int8_t any = 0;
    try {
      for (int b = 0; b < 256 && !any; ++b) any = step_locked(state, uint8_t(b)) >= 0;
    } catch (const Error&) {
      return true;  // past the table budget: not known to be complete; the next mask reports the budget
    }
    continues_[size_t(state)] = any;
  }
  return continues_[size_t(state)] == 1;
}

size_t CompiledGrammar::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sizeof(*this) + nfa_bytes_ + table_bytes_ + mask_bytes_ + description_.size();
}

void CompiledGrammar::warm_up(size_t probe_bytes, const std::function<bool()>& cancelled) const {
  std::vector<uint32_t> mask(size_t(vocab_->n_mask_words()));
  {
    std::unique_lock<std::mutex> lock(mutex_);
    walk_locked(0, mask, lock, cancelled ? &cancelled : nullptr);
    cache_mask_locked(0, mask);
  }
  // Printable bytes first, as text mostly is; then the rest.
  static const std::vector<uint8_t> kOrder = [] {
    std::vector<uint8_t> order;
    for (int b = 0x20; b < 0x7F; ++b) order.push_back(uint8_t(b));
    for (int b = 0; b < 256; ++b)
      if (b < 0x20 || b >= 0x7F) order.push_back(uint8_t(b));
    return order;
  }();
  std::lock_guard<std::mutex> lock(mutex_);
  int32_t state = 0;
  for (size_t i = 0; i < probe_bytes && state >= 0; ++i) {
    if (cancelled && cancelled()) fail(ErrorCode::kInvalidArgument, "grammar compilation was cancelled (the client has gone)");
    int32_t next = kDeadState;
    for (uint8_t b : kOrder) {
      next = step_locked(state, b);
      if (next >= 0) break;
    }
    state = next;
  }
}

size_t CompiledGrammar::n_dfa_states() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_.size();
}

void CompiledGrammar::walk_locked(int32_t state, std::span<uint32_t> mask, std::unique_lock<std::mutex>& lock,
                                  const std::function<bool()>* cancelled) const {
  const auto t0 = std::chrono::steady_clock::now();
  struct Timed {  // also when the walk throws (cancelled): the time spent says what a walk costs
    std::chrono::steady_clock::time_point t0;
    std::atomic<double>& out;
    ~Timed() {
      out.store(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                std::memory_order_relaxed);
    }
  } timed{t0, last_walk_ms_};
  std::fill(mask.begin(), mask.end(), 0u);
  const auto& sorted = vocab_->sorted_;
  const auto& lcp = vocab_->lcp_;
  std::vector<int32_t> st(vocab_->max_len_ + 1);
  st[0] = state;
  size_t valid = 0;  // st[0..valid] hold the states after the previous token's first bytes
  size_t i = 0;
  const size_t n = sorted.size();
  while (i < n) {
    if ((i & 4095) == 4095) {
      // A long walk (a new state of a large choice grammar) lets the other
      // sequences of this grammar step on: what it holds are state ids,
      // which stay valid while others add states.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    if (cancelled && (i & 4095) == 0 && (*cancelled)())
      fail(ErrorCode::kInvalidArgument, "grammar compilation was cancelled (the client has gone)");
    const int32_t id = sorted[i];
    const std::string& b = vocab_->bytes_[size_t(id)];
    size_t k = std::min(size_t(lcp[i]), valid);
    bool ok = true;
    for (; k < b.size(); ++k) {
      const int32_t nx = step_locked(st[k], uint8_t(b[k]));
      if (nx < 0) {
        ok = false;
        break;
      }
      st[k + 1] = nx;
    }
    ++i;
    if (ok) {
      mask[size_t(id) >> 5] |= uint32_t(1) << (id & 31);
      valid = b.size();
    } else {
      valid = k;  // every later token starting with b[0..k] dies too
      while (i < n && size_t(lcp[i]) > k) ++i;
    }
  }
}

void CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> mask) const { fill_mask(state, mask, nullptr); }

void CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> mask, const std::function<bool()>& cancelled) const {
  SHARDLM_CHECK(mask.size() == size_t(vocab_->n_mask_words()), "mask has ", mask.size(), " words, need ",
                vocab_->n_mask_words());
  std::unique_lock<std::mutex> lock(mutex_);
  if (state < 0) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  auto it = masks_.find(state);
  if (it != masks_.end()) {
    std::memcpy(mask.data(), it->second.data(), mask.size() * sizeof(uint32_t));
    return;
  }
  walk_locked(state, mask, lock, cancelled ? &cancelled : nullptr);
  cache_mask_locked(state, mask);
}

bool CompiledGrammar::mask_cached(int32_t state) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state < 0 || masks_.count(state) != 0;
}

void CompiledGrammar::cache_mask_locked(int32_t state, std::span<const uint32_t> mask) const {
  const size_t bytes = mask.size() * sizeof(uint32_t);
  // Another thread may have walked the same state meanwhile (the lock is
  // released during a walk).
  if (!masks_.count(state) && mask_bytes_ + bytes <= kMaskCacheBytes) {
    masks_.emplace(state, std::vector<uint32_t>(mask.begin(), mask.end()));
    mask_bytes_ += bytes;
  }
}

std::string CompiledGrammar::shortest_completion(int32_t state) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state < 0) fail(ErrorCode::kInvalidArgument, "shortest_completion: the matcher is in a dead state");
  std::unordered_map<int32_t, std::pair<int32_t, uint8_t>> parent;  // state -> (previous, byte)
  std::deque<int32_t> queue = {state};
  parent.emplace(state, std::make_pair(-1, uint8_t(0)));
  constexpr size_t kMaxVisited = 1'000'000;
  while (!queue.empty()) {
    const int32_t s = queue.front();
    queue.pop_front();
    if (accepting_[size_t(s)]) {
      std::string out;
      for (int32_t cur = s; cur != state;) {
        const auto& [prev, byte] = parent.at(cur);
        out.push_back(char(byte));
        cur = prev;
      }
      std::reverse(out.begin(), out.end());
      return out;
    }
    for (int b = 0; b < 256; ++b) {
      const int32_t t = step_locked(s, uint8_t(b));
      if (t < 0 || parent.count(t)) continue;
      parent.emplace(t, std::make_pair(s, uint8_t(b)));
      queue.push_back(t);
    }
    if (parent.size() > kMaxVisited) break;
  }
  fail(ErrorCode::kInternal, "grammar (", description_, "): no completion found from state ", state);
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  SHARDLM_CHECK(grammar_ != nullptr);
  states_.push_back(grammar_->start_state());
  stopped_.push_back(0);
}

bool GrammarMatcher::accept_token(int32_t token) {
  const TokenVocabulary& v = grammar_->vocabulary();
  if (token < 0 || token >= v.size() || stopped_.back()) return false;
  if (v.is_stop(token)) {
    if (!is_complete()) return false;
    states_.push_back(states_.back());
    stopped_.push_back(1);
    return true;
  }
  const std::string& b = v.bytes(token);
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (stopped_.back()) return false;
  const int32_t next = grammar_->step_bytes(states_.back(), bytes);
  if (next < 0) return false;
  states_.push_back(next);
  stopped_.push_back(0);
  return true;
}

bool GrammarMatcher::fill_next_token_bitmask(std::span<uint32_t> mask) const {
  if (stopped_.back()) {
    std::fill(mask.begin(), mask.end(), 0u);
    return false;
  }
  grammar_->fill_mask(states_.back(), mask);
  return finish_mask(mask);
}

bool GrammarMatcher::fill_next_token_bitmask_from(std::span<const uint32_t> state_mask, std::span<uint32_t> mask) const {
  if (stopped_.back()) {
    std::fill(mask.begin(), mask.end(), 0u);
    return false;
  }
  SHARDLM_CHECK(state_mask.size() == mask.size(), "state mask has ", state_mask.size(), " words, need ", mask.size());
  std::copy(state_mask.begin(), state_mask.end(), mask.begin());
  return finish_mask(mask);
}

bool GrammarMatcher::next_mask_cached() const { return stopped_.back() || grammar_->mask_cached(states_.back()); }

bool GrammarMatcher::finish_mask(std::span<uint32_t> mask) const {
  if (is_complete())
    for (int32_t s : grammar_->vocabulary().stop_ids()) mask[size_t(s) >> 5] |= uint32_t(1) << (s & 31);
  for (uint32_t w : mask)
    if (w) return true;
  return false;
}

bool GrammarMatcher::is_complete() const { return grammar_->is_accepting(states_.back()); }

bool GrammarMatcher::is_terminated() const {
  return stopped_.back() || (is_complete() && !grammar_->can_continue(states_.back()));
}

void GrammarMatcher::rollback(int32_t n) {
  if (n < 0 || n > n_tokens())
    fail(ErrorCode::kInvalidArgument, "grammar rollback of ", n, " tokens, but only ", n_tokens(), " were accepted");
  states_.resize(states_.size() - size_t(n));
  stopped_.resize(stopped_.size() - size_t(n));
}

}  // namespace shardlm::grammar
