// A byte-level NFA and the builder every grammar front end (regex, JSON
// schema, choice list) writes into.
//
// Construction is continuation-passing: each helper takes the state `next`
// that the fragment must lead to and returns the fragment's start state.
// Tails are therefore shared instead of copied (the remaining properties of
// an object, the loop back of a repetition), which keeps the NFA linear in the
// size of the schema. kEmpty stands for the empty language (nothing matches);
// sequences containing it are empty and alternatives drop it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

namespace shardlm::grammar {

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void add(uint8_t b) { bits[b >> 6] |= uint64_t(1) << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(uint8_t(b));
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return !(bits[0] | bits[1] | bits[2] | bits[3]); }
};

struct NfaEdge {
  ByteSet bytes;
  int32_t to = 0;
};

struct Nfa {
  std::vector<std::vector<NfaEdge>> edges;  // [n_states]: byte transitions
  std::vector<std::vector<int32_t>> eps;    // [n_states]: epsilon transitions
  int32_t start = 0;
  int32_t accept = 0;                       // the single accepting state (no outgoing edges)
  size_t n_states() const { return edges.size(); }
};

constexpr int32_t kEmpty = -1;
// Largest NFA one grammar may build (about 100 bytes a state).
constexpr size_t kMaxNfaStates = 2'000'000;
// Largest bounded repetition count ({m,n}, maxLength, maxItems) that is
// expanded; larger bounds are refused with an error naming them.
constexpr int64_t kMaxRepeat = 4096;

class NfaBuilder {
 public:
  NfaBuilder();
  int32_t add_state();  // throws Error(kUnsupported) beyond kMaxNfaStates
  // Polled every 65,536 states; true makes add_state throw Error (the
  // request that asked for the grammar has gone). Not owned.
  void set_cancelled(const std::function<bool()>* cancelled) { cancelled_ = cancelled; }
  void add_eps(int32_t from, int32_t to);
  void add_bytes(int32_t from, const ByteSet& bytes, int32_t to);

  int32_t accept() const { return accept_; }  // the final state; fragments for the whole grammar lead here

  // The fragment matching exactly `bytes`, then next.
  int32_t literal(std::string_view bytes, int32_t next);
  // One byte of `set`, then next.
  int32_t byte_of(const ByteSet& set, int32_t next);
  // Any of the fragments (their starts); kEmpty when all are empty.
  int32_t alt(std::span<const int32_t> starts);
  // body(next') builds one copy leading to next'. Between min and max copies
  // (max < 0: unbounded), then next. Throws Error(kUnsupported) naming `what`
  // when a bound exceeds kMaxRepeat.
  int32_t repeat(const std::function<int32_t(int32_t)>& body, int64_t min, int64_t max, int32_t next,
                 std::string_view what);
  // One UTF-8 encoded code point in [lo, hi] (surrogates excluded), then next.
  int32_t codepoint_range(uint32_t lo, uint32_t hi, int32_t next);

  // The finished automaton, starting at `start` (throws Error(kInvalidArgument)
  // when start is kEmpty: the grammar matches nothing).
  Nfa finish(int32_t start, std::string_view what);

 private:
  void utf8_range(uint32_t lo, uint32_t hi, int32_t next, std::vector<int32_t>* starts);
  Nfa nfa_;
  int32_t accept_ = 0;
  const std::function<bool()>* cancelled_ = nullptr;
};

// Encodes a code point as UTF-8.
void append_utf8(uint32_t cp, std::string* out);

}  // namespace shardlm::grammar
