// A grammar compiled against one tokenizer vocabulary, and the per-sequence
// matcher that walks it (xgrammar's compile once / fill mask / accept token /
// rollback interface, our own implementation).
//
// The grammar is a byte-level NFA (grammar/nfa.h) determinised lazily: a DFA
// state is the epsilon-closed set of NFA states, and each (state, byte)
// transition is computed once, then read from a table. A token is allowed in
// a state when its bytes walk the DFA without dying; the mask of a state is
// found by walking the vocabulary in sorted byte order (shared prefixes are
// stepped once, and a dead prefix skips every token that starts with it),
// then cached: the states a JSON grammar revisits (inside a string, between
// members) cost one copy of the mask. Recursive structures are unrolled to a
// bounded depth by the front ends, so no stack is needed.
//
// Thread-safety: a CompiledGrammar is shared by every sequence that uses it
// (const methods are safe to call from several threads; its lazy tables are
// guarded by a mutex). A GrammarMatcher belongs to one sequence.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/nfa.h"

namespace shardlm::grammar {

// The model's tokens as byte strings, sorted for mask walks.
class TokenVocabulary {
 public:
  // token_bytes: [vocab_size] the bytes each id stands for; an empty string
  // means the id is never produced under a grammar (special tokens, holes).
  // stop_ids: end-of-sequence tokens, allowed exactly where the grammar is
  // complete. Throws Error(kInvalidArgument) for stop ids out of range.
  TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int32_t> stop_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t n_mask_words() const { return (size() + 31) / 32; }  // uint32 words in one bitmask
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool is_stop(int32_t id) const;

 private:
  friend class CompiledGrammar;
  std::vector<std::string> bytes_;  // [vocab_size]
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> sorted_;     // ids with non-empty bytes, in byte order
  std::vector<int32_t> lcp_;        // [sorted_.size()]: common prefix length with the previous one
  size_t max_len_ = 0;
};

constexpr int32_t kDeadState = -1;
// Most DFA states one grammar may build (each costs 1 KiB of table).
constexpr size_t kMaxDfaStates = 200'000;
// Mask bytes cached per grammar; beyond it masks are recomputed per step.
constexpr size_t kMaskCacheBytes = size_t(64) << 20;
// DFA table bytes one grammar may build (each state's NFA set, its index
// entry and its 1 KiB transition row), lazily, while compiling and while
// decoding. A nested bounded repetition such as ^(.{1,50}){30,80}$ tracks
// thousands of NFA states in every DFA state: it grew by 150 MiB and took
// minutes. Past the budget the grammar is refused (at compile: a 400; while
// decoding: that request fails), naming the limit.
constexpr size_t kMaxGrammarTableBytes = size_t(64) << 20;

class CompiledGrammar {
 public:
  // description: what it was compiled from, for messages ("json_schema", "regex").
  CompiledGrammar(Nfa nfa, std::shared_ptr<const TokenVocabulary> vocab, std::string description,
                  size_t max_table_bytes = kMaxGrammarTableBytes);

  const TokenVocabulary& vocabulary() const { return *vocab_; }
  const std::string& description() const { return description_; }

  int32_t start_state() const { return 0; }
  // The state after `bytes` from `state`, or kDeadState.
  int32_t step_bytes(int32_t state, std::string_view bytes) const;
  bool is_accepting(int32_t state) const;
  // Some byte can follow (false: the text is complete and must end here).
  bool can_continue(int32_t state) const;
  // mask: [n_mask_words]; sets exactly the bits of tokens (not stop ids)
  // whose bytes the grammar accepts from state.
  void fill_mask(int32_t state, std::span<uint32_t> mask) const;
  // The same, polling `cancelled` (when set) every few thousand tokens of
  // a walk; true throws Error.
  void fill_mask(int32_t state, std::span<uint32_t> mask, const std::function<bool()>& cancelled) const;
  // fill_mask(state) would be a copy of a cached mask, not a walk over the
  // vocabulary (always true for the dead state).
  bool mask_cached(int32_t state) const;
  // How long the latest walk over the vocabulary took (the start state's,
  // at compile, until another is walked): what a new state's mask costs.
  double last_walk_ms() const { return last_walk_ms_.load(std::memory_order_relaxed); }
  // The shortest byte string leading from state to completion.
  std::string shortest_completion(int32_t state) const;

  size_t n_dfa_states() const;
  size_t n_nfa_states() const { return nfa_.n_states(); }
  // Bytes this grammar holds now: its NFA, DFA tables and cached masks (the
  // tables and masks grow as sequences use it).
  size_t memory_bytes() const;

  // Compile-time work, on the requesting thread instead of the engine's: the
  // start state's mask (a walk over the whole vocabulary; large choice
  // grammars cost seconds there), then `probe_bytes` bytes walked from the
  // start, each the first byte that keeps the text alive, so that a grammar
  // whose automaton explodes with the text's length (nested repetitions)
  // hits the table budget here. `cancelled` (when set) is polled every few
  // thousand tokens and at every probe byte; true throws Error.
  void warm_up(size_t probe_bytes, const std::function<bool()>& cancelled) const;

 private:
  int32_t step_locked(int32_t state, uint8_t byte) const;
  int32_t intern_locked(std::vector<int32_t> set) const;
  void closure(std::vector<int32_t>* set) const;
  // Walks the sorted vocabulary from state; releases `lock` (on mutex_) for
  // a moment every few thousand tokens.
  void walk_locked(int32_t state, std::span<uint32_t> mask, std::unique_lock<std::mutex>& lock,
                   const std::function<bool()>* cancelled = nullptr) const;
  void cache_mask_locked(int32_t state, std::span<const uint32_t> mask) const;

  Nfa nfa_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::string description_;
  std::vector<uint8_t> keep_;  // [nfa states]: has byte edges or is the accept state
  size_t max_table_bytes_;
  size_t nfa_bytes_ = 0;       // the NFA's heap bytes, counted once

  mutable std::mutex mutex_;
  mutable std::vector<uint32_t> visited_;  // [nfa states]: closure()'s marks, == stamp_ when visited
  mutable uint32_t stamp_ = 0;
  mutable std::vector<std::vector<int32_t>> sets_;  // [dfa states]: sorted NFA states
  mutable std::vector<int32_t> trans_;              // [dfa states * 256]: next state, kDeadState, or kUnknown
  mutable std::vector<uint8_t> accepting_;          // [dfa states]
  mutable std::vector<int8_t> continues_;           // [dfa states]: -1 unknown, 0, 1
  mutable std::map<std::vector<int32_t>, int32_t> index_;
  mutable std::unordered_map<int32_t, std::vector<uint32_t>> masks_;  // state -> [n_mask_words]
  mutable size_t mask_bytes_ = 0;
  mutable std::atomic<double> last_walk_ms_{0.0};
  mutable size_t table_bytes_ = 0;  // sets_, index_ and trans_, as intern_locked counts them
};

// The grammar state of one sequence.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Advances by one token. Returns false (state unchanged) when the grammar
  // does not allow it here. A stop token is allowed only when complete and
  // terminates the matcher.
  bool accept_token(int32_t token);
  bool accept_bytes(std::string_view bytes);
  // mask: [vocabulary().n_mask_words()]; bit t % 32 of word t / 32 is set
  // when token t may come next (stop ids when complete). Returns false when
  // no token at all is allowed (the vocabulary cannot spell what must follow).
  bool fill_next_token_bitmask(std::span<uint32_t> mask) const;
  // The same from `state_mask`, the mask of state() computed elsewhere
  // (CompiledGrammar::fill_mask on another thread).
  bool fill_next_token_bitmask_from(std::span<const uint32_t> state_mask, std::span<uint32_t> mask) const;
  // The next mask is a copy of a cached one (or the matcher has stopped):
  // no walk over the vocabulary.
  bool next_mask_cached() const;
  int32_t state() const { return states_.back(); }
  bool is_complete() const;    // the text so far matches: a stop token may end it
  bool is_terminated() const;  // a stop token was accepted, or complete and nothing may follow
  // Undoes the last n accepted tokens (n <= n_tokens()).
  void rollback(int32_t n);
  int32_t n_tokens() const { return static_cast<int32_t>(states_.size()) - 1; }
  std::string shortest_completion() const { return grammar_->shortest_completion(states_.back()); }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> states_;   // [n_tokens + 1] DFA state after each token
  std::vector<uint8_t> stopped_;  // [n_tokens + 1] a stop token was accepted

  bool finish_mask(std::span<uint32_t> mask) const;  // adds stop ids when complete; false: nothing allowed
};

}  // namespace shardlm::grammar
