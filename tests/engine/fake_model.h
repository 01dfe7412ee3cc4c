// A deterministic stand-in for the model that also audits what the engine
// hands it. It keeps a simulated paged KV cache (the token id and position
// written in each slot) and computes a sequence's logits from the tokens it
// reads back through the block table, so any bookkeeping error (stale prefix
// hit, block overwritten by another sequence, bad recompute after
// preemption) changes the output tokens. reference_greedy() computes the
// expected tokens from the prompt alone, sharing no code with the engine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <map>
#include <set>
#include <sstream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/detokenizer.h"
#include "engine/model_executor.h"

namespace shardlm::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of a whole context, then a pseudo-random logit row from it.
inline uint64_t context_hash(std::span<const int32_t> tokens) {
  uint64_t h = 0x1234567;
  for (int32_t t : tokens) h = mix64(h ^ uint64_t(t + 1));
  return h;
}
inline void fill_logits(uint64_t h, float* row, int64_t vocab) {
  for (int64_t v = 0; v < vocab; ++v) row[v] = float(mix64(h ^ uint64_t(v * 7919 + 3)) >> 40) / float(1 << 24) * 8.0f - 4.0f;
}

// window > 0: the logits depend on the last `window` tokens only (a model
// whose greedy output soon cycles, so n-gram drafts get accepted).
inline std::span<const int32_t> hashed_tail(std::span<const int32_t> context, int32_t window) {
  return window > 0 && context.size() > size_t(window) ? context.last(size_t(window)) : context;
}

inline std::vector<int32_t> reference_greedy(std::vector<int32_t> context, int32_t n_new, int64_t vocab,
                                             int32_t window = 0) {
  std::vector<int32_t> out;
  std::vector<float> row(vocab);
  for (int32_t i = 0; i < n_new; ++i) {
    fill_logits(context_hash(hashed_tail(context, window)), row.data(), vocab);
    int32_t best = 0;
    for (int32_t v = 1; v < vocab; ++v)
      if (row[v] > row[best]) best = v;
    out.push_back(best);
    context.push_back(best);
  }
  return out;
}

class FakeModel : public ModelExecutor {
 public:
  FakeModel(int64_t vocab, int32_t n_blocks, int32_t block_size)
      : vocab_(vocab), block_size_(block_size), n_blocks_(n_blocks),
        slot_token_(size_t(n_blocks) * block_size, -1), slot_pos_(size_t(n_blocks) * block_size, -1) {}

  int64_t vocab_size() const override { return vocab_; }
  // > 1: behaves as a pipeline of that depth (ModelExecutor's default
  // submit/collect, which runs each batch at its collect, in order).
  int max_in_flight() const override { return depth; }

  void execute(const ForwardBatch& batch, float* logits) override {
    ++n_steps;
    n_rows += int64_t(batch.seqs.size());
    if (throw_next) {
      throw_next = false;
      throw std::runtime_error("injected device failure");
    }
    max_batch_tokens = std::max<int64_t>(max_batch_tokens, batch.n_tokens());
    batch_sizes.push_back(int32_t(batch.seqs.size()));
    int64_t sum = 0;
    std::map<int32_t, size_t> writer;  // block -> seq index writing it
    std::map<int32_t, int> n_tables;   // block -> number of tables naming it
    // Speculative verification feeds one sequence as several one-token rows
    // over the same block table: rows with equal tables are one sequence.
    std::set<std::vector<int32_t>> tables;
    bool has_chunk = false, has_decode = false;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const auto& s = batch.seqs[i];
      sum += s.n_tokens;
      if (s.n_tokens < 1) error("seq ", i, " has no tokens");
      if (int64_t(s.block_table.size()) * block_size_ < s.n_past + s.n_tokens)
        error("seq ", i, " block table covers ", s.block_table.size() * block_size_, " < ", s.n_past + s.n_tokens);
      const bool new_table = tables.insert(s.block_table).second;
      for (int32_t b : s.block_table) {
        if (b < 0 || b >= n_blocks_) error("block id ", b, " out of range");
        if (new_table) ++n_tables[b];
      }
      for (int32_t p = s.n_past; p < s.n_past + s.n_tokens; ++p) {
        int32_t b = s.block_table[p / block_size_];
        auto [it, fresh] = writer.emplace(b, i);
        if (!fresh && it->second != i && batch.seqs[it->second].block_table != s.block_table)
          error("block ", b, " written by two sequences");
      }
      if (s.n_tokens > 1 && s.n_past + s.n_tokens > 1) has_chunk = true;
      if (s.n_tokens == 1 && s.n_past > 0) has_decode = true;
    }
    if (sum != batch.n_tokens()) error("token count ", batch.n_tokens(), " != sum of chunks ", sum);
    // A block several sequences use must be a read-only (cached, full) prefix block.
    for (auto [b, n] : n_tables)
      if (n > 1 && writer.count(b)) error("block ", b, " is shared by ", n, " sequences and written");
    if (has_chunk && has_decode) ++n_mixed_steps;

    int64_t offset = 0, row = 0;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const auto& s = batch.seqs[i];
      // Cached positions must hold what an earlier step wrote at that position.
      std::vector<int32_t> context;
      for (int32_t p = 0; p < s.n_past; ++p) {
        size_t slot = size_t(s.block_table[p / block_size_]) * block_size_ + p % block_size_;
        if (slot_pos_[slot] != p) error("seq ", i, " reads position ", p, " from a slot holding position ", slot_pos_[slot]);
        context.push_back(slot_token_[slot]);
      }
      for (int32_t j = 0; j < s.n_tokens; ++j) {
        int32_t p = s.n_past + j;
        size_t slot = size_t(s.block_table[p / block_size_]) * block_size_ + p % block_size_;
        slot_token_[slot] = batch.token_ids[offset + j];
        slot_pos_[slot] = p;
        context.push_back(batch.token_ids[offset + j]);
        // all_logits: a row per position, from the context up to it.
        if (s.all_logits) fill_logits(context_hash(hashed_tail(context, window)), logits + row++ * vocab_, vocab_);
      }
      offset += s.n_tokens;
      if (s.all_logits) max_logit_rows = std::max<int64_t>(max_logit_rows, s.n_tokens);
      if (s.need_logits && !s.all_logits) fill_logits(context_hash(hashed_tail(context, window)), logits + row++ * vocab_, vocab_);
    }
  }

  int64_t n_steps = 0;
  int64_t n_mixed_steps = 0;  // steps holding both a multi-token chunk and a decode
  int64_t max_batch_tokens = 0;
  int64_t max_logit_rows = 0;  // the largest all_logits chunk seen
  std::vector<int32_t> batch_sizes;
  std::vector<std::string> errors;  // consistency violations seen
  bool throw_next = false;
  int depth = 1;
  int32_t window = 0;  // > 0: logits from the last `window` tokens (reference_greedy's window)
  int64_t n_rows = 0;  // sequence rows run (a verified draft is a row of its own)

 private:
  template <typename... A>
  void error(A&&... a) {
    std::ostringstream s;
    (s << ... << a);
    errors.push_back(s.str());
  }
  int64_t vocab_;
  int32_t block_size_;
  int32_t n_blocks_;
  std::vector<int32_t> slot_token_;  // [n_blocks * block_size]
  std::vector<int32_t> slot_pos_;
};

// Token t -> one letter ('a' + t % 26) for t < 52, else a 2-byte character,
// delivered one byte per push() for odd ids so the stream must hold partial UTF-8.
inline std::string toy_piece(int32_t t) {
  if (t < 52) return std::string(1, char('a' + t % 26));
  return t % 2 ? "\xC3\xA9" : "\xC3\x9F";  // é ß
}

class ToyDetokenizer : public Detokenizer {
  class Stream : public DetokenizerStream {
   public:
    std::string push(int32_t t) override {
      std::string piece = toy_piece(t);
      if (t >= 52 && t % 2) {  // emit é only at the next token
        std::string out = pending_;
        pending_ = piece;
        return out;
      }
      std::string out = pending_ + piece;
      pending_.clear();
      return out;
    }
    std::string flush() override { return std::exchange(pending_, std::string()); }

   private:
    std::string pending_;
  };

 public:
  std::unique_ptr<DetokenizerStream> stream(std::span<const int32_t>, bool) const override {
    return std::make_unique<Stream>();
  }
};

inline std::string toy_text(std::span<const int32_t> tokens) {
  std::string s;
  for (int32_t t : tokens) s += toy_piece(t);
  return s;
}

}  // namespace shardlm::testing
