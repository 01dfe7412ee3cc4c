// --batch-invariant end to end: through the engine over a real (random-weight)
// model, one request's tokens AND logprobs are bit-identical whether it runs
// alone, amid 15 other concurrent requests, or with its prefill split into
// chunks (max_num_batched_tokens below its prompt length), at TP 1 and at
// TP 2 with uneven heads (7 Q heads: 4 + 3). Every op of the step (matmuls,
// attention, norms, lm_head) must keep a row's reduction order independent of
// the step's other rows for this to hold.
#include <gtest/gtest.h>

#include <bit>
#include <map>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "random_weights.h"

namespace shardlm {
namespace {

constexpr int kMaxTokens = 8;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<uint32_t> logprob_bits;  // each chosen token's logprob, as bits
};

ModelSpec test_spec() {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  spec.n_heads = 7;  // TP 2: ranks hold 4 and 3 Q heads
  spec.n_kv_heads = 1;
  spec.head_dim = 32;
  return spec;
}

std::vector<int32_t> prompt_for(int i, int64_t vocab) {
  std::vector<int32_t> p;
  for (int k = 0; k < 9 + 3 * i; ++k) p.push_back(int32_t((k * 53 + i * 97 + 5) % vocab));
  return p;
}

// Runs requests first .. first+n_requests-1 concurrently through one engine
// (request 0 is the one watched); returns each request's output by index.
std::map<int, Output> run(int tp, int n_requests, int32_t max_num_batched_tokens, bool batch_invariant,
                          int first = 0) {
  const ModelSpec spec = test_spec();
  auto weights = testing::random_weights(spec, 11);
  LocalGroupOptions gopt;
  gopt.layout.tp = tp;
  gopt.n_blocks = 256;
  gopt.block_size = 4;
  gopt.kv_dtype = DType::kF32;
  gopt.n_threads_per_rank = 1;
  gopt.batch_invariant = batch_invariant;
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 256;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  cfg.scheduler.max_model_len = 128;
  cfg.scheduler.enable_prefix_caching = false;
  Engine engine(cfg, executor);
  std::map<int, Output> got;
  for (int i = first; i < first + n_requests; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt_for(i, spec.vocab_size);
    r.sampling.temperature = 0.0;
    r.stop.max_tokens = kMaxTokens;
    r.logprobs = true;
    engine.submit(r, {[&, i](const SequenceOutput& o) {
      Output& out = got[i];
      out.tokens.insert(out.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      for (const TokenLogprobs& lp : o.logprobs) out.logprob_bits.push_back(std::bit_cast<uint32_t>(lp.logprob));
    }});
  }
  engine.run_until_idle();
  backend::set_batch_invariant(false);  // process-wide on the CPU: leave it as other tests expect
  return got;
}

void expect_same_alone_loaded_chunked(int tp) {
  const int64_t watched_len = static_cast<int64_t>(prompt_for(0, test_spec().vocab_size).size());
  const Output alone = run(tp, 1, 512, true).at(0);
  ASSERT_EQ(alone.tokens.size(), size_t(kMaxTokens));
  ASSERT_EQ(alone.logprob_bits.size(), size_t(kMaxTokens));

  const std::map<int, Output> loaded = run(tp, 16, 512, true);  // all 16 prefill in one step, then decode together
  ASSERT_EQ(loaded.size(), 16u);
  EXPECT_EQ(loaded.at(0).tokens, alone.tokens) << "TP " << tp << ": amid 15 others";
  EXPECT_EQ(loaded.at(0).logprob_bits, alone.logprob_bits) << "TP " << tp << ": amid 15 others";

  const int32_t chunk = 4;  // the watched prompt (9 tokens) prefills in 3 chunks
  ASSERT_GT(watched_len, 2 * chunk);
  const Output chunked = run(tp, 1, chunk, true).at(0);
  EXPECT_EQ(chunked.tokens, alone.tokens) << "TP " << tp << ": prefill in chunks of " << chunk;
  EXPECT_EQ(chunked.logprob_bits, alone.logprob_bits) << "TP " << tp << ": prefill in chunks of " << chunk;

  // Loaded and chunked at once: the other 15 prompts are chunked too.
  const std::map<int, Output> both = run(tp, 16, 12, true);
  EXPECT_EQ(both.at(0).tokens, alone.tokens) << "TP " << tp << ": amid 15 others, chunked";
  EXPECT_EQ(both.at(0).logprob_bits, alone.logprob_bits) << "TP " << tp << ": amid 15 others, chunked";
  // The longest other request (54 tokens, chunked over several steps) equals its own alone run.
  const Output last_alone = run(tp, 1, 512, true, 15).at(15);
  EXPECT_EQ(both.at(15).tokens, last_alone.tokens) << "TP " << tp << ": request 15";
  EXPECT_EQ(both.at(15).logprob_bits, last_alone.logprob_bits) << "TP " << tp << ": request 15";
}

TEST(EngineBatchInvariance, Tp1SameTokensAndLogprobsAloneLoadedChunked) { expect_same_alone_loaded_chunked(1); }

TEST(EngineBatchInvariance, Tp2UnevenHeadsSameTokensAndLogprobsAloneLoadedChunked) {
  expect_same_alone_loaded_chunked(2);
}

// Speculative decoding through the engine over the real model: concurrent
// greedy requests on copy-heavy prompts (so drafts get accepted, asserted)
// give the tokens and logprob bits of plain decoding on the same
// batch-invariant kernels, at TP 1 and at uneven TP 2.
struct SpecOutcome {
  std::map<int, Output> outputs;
  int64_t n_accepted = 0;
  int64_t peak_blocks = 0;  // the engine's kv_blocks_in_use_peak
  int64_t peak_local_blocks = 0;  // kv_local_blocks_in_use_peak
};

// window > 0: every layer attends to its last `window` positions (hybrid:
// layer 0 only, Gemma 3's way; layer 1 attends to its whole past);
// free_window: the scheduler releases the blocks that leave it (hybrid: in
// the local layer's own pool).
SpecOutcome run_speculative(int tp, bool speculate, int32_t window = 0, bool free_window = false,
                            bool hybrid = false) {
  ModelSpec spec = test_spec();
  if (window > 0) {
    spec.sliding_window = window;
    spec.sliding_layers.assign(size_t(spec.n_layers), true);
    if (hybrid) spec.sliding_layers.back() = false;
  }
  auto weights = testing::random_weights(spec, 11);
  LocalGroupOptions gopt;
  gopt.layout.tp = tp;
  gopt.n_blocks = 128;
  gopt.n_local_blocks = hybrid && free_window ? 64 : 0;
  gopt.block_size = 4;
  gopt.kv_dtype = DType::kF32;
  gopt.n_threads_per_rank = 1;
  gopt.batch_invariant = true;
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 128;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_model_len = 128;
  cfg.scheduler.sliding_window = free_window && !hybrid ? window : 0;
  if (hybrid && free_window) {
    cfg.scheduler.local_sliding_window = window;
    cfg.scheduler.n_local_blocks = 64;
    cfg.scheduler.max_num_batched_tokens = 32;  // a sequence holds at most ceil((window - 1 + 32) / 4) + 1 local blocks
  }
  if (speculate) cfg.speculative = {4, 2, 4};
  Engine engine(cfg, executor);
  SpecOutcome got;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt;
    for (int rep = 0; rep < 3; ++rep)
      for (int k = 0; k < 5 + i; ++k) prompt.push_back(int32_t((k * 37 + i * 101 + 11) % spec.vocab_size));
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt;
    r.sampling.temperature = 0.0;
    r.stop.max_tokens = 12;
    r.stop.ignore_eos = true;
    r.logprobs = true;
    engine.submit(r, {[&, i](const SequenceOutput& o) {
      Output& out = got.outputs[i];
      out.tokens.insert(out.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      for (const TokenLogprobs& lp : o.logprobs) out.logprob_bits.push_back(std::bit_cast<uint32_t>(lp.logprob));
    }});
  }
  engine.run_until_idle();
  got.n_accepted = engine.metrics().snapshot().spec_decode_num_accepted_tokens_total;
  got.peak_blocks = engine.metrics().snapshot().kv_blocks_in_use_peak;
  got.peak_local_blocks = engine.metrics().snapshot().kv_local_blocks_in_use_peak;
  backend::set_batch_invariant(false);
  return got;
}

void expect_speculation_identical(int tp) {
  const SpecOutcome plain = run_speculative(tp, false);
  const SpecOutcome spec = run_speculative(tp, true);
  ASSERT_EQ(plain.outputs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(spec.outputs.at(i).tokens, plain.outputs.at(i).tokens) << "TP " << tp << " request " << i;
    EXPECT_EQ(spec.outputs.at(i).logprob_bits, plain.outputs.at(i).logprob_bits) << "TP " << tp << " request " << i;
    EXPECT_EQ(spec.outputs.at(i).tokens.size(), 12u);
  }
  EXPECT_GT(spec.n_accepted, 0) << "TP " << tp << ": no draft accepted; the identity proved nothing";
}

TEST(EngineSpeculation, Tp1GreedyTokensAndLogprobsEqualPlainDecoding) { expect_speculation_identical(1); }

// Drafts over a sliding window (10 positions, blocks of 4) whose blocks the
// scheduler releases: rows of drafts read their own windows, rejected ones
// are rolled back, and the tokens and logprob bits are those of plain
// decoding with every block kept.
TEST(EngineSpeculation, SlidingWindowDraftsEqualPlainDecodingThatKeepsEveryBlock) {
  const SpecOutcome kept = run_speculative(1, false, 10, false);
  const SpecOutcome spec = run_speculative(1, true, 10, true);
  ASSERT_EQ(kept.outputs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(spec.outputs.at(i).tokens, kept.outputs.at(i).tokens) << "request " << i;
    EXPECT_EQ(spec.outputs.at(i).logprob_bits, kept.outputs.at(i).logprob_bits) << "request " << i;
  }
  EXPECT_GT(spec.n_accepted, 0) << "no draft accepted; the identity proved nothing";
  EXPECT_LT(spec.peak_blocks, kept.peak_blocks);
  const SpecOutcome full = run_speculative(1, false);  // the window changes the tokens: it is in effect
  EXPECT_NE(full.outputs.at(2).tokens, kept.outputs.at(2).tokens);
}
// The same over a hybrid model (layer 0 slides over 12 positions, layer 1 does not) whose
// local layer keeps its KV in a pool of its own: drafts take blocks in both
// pools, rejected rows are rolled back in both, and the local table releases
// blocks as the window moves; tokens and logprob bits equal plain decoding
// with one pool that keeps every block.
TEST(EngineSpeculation, HybridLocalPoolDraftsEqualPlainDecodingThatKeepsEveryBlock) {
  const SpecOutcome kept = run_speculative(1, false, 12, false, true);
  const SpecOutcome spec = run_speculative(1, true, 12, true, true);  // (windows 4-8 accept no draft here)
  ASSERT_EQ(kept.outputs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(spec.outputs.at(i).tokens, kept.outputs.at(i).tokens) << "request " << i;
    EXPECT_EQ(spec.outputs.at(i).logprob_bits, kept.outputs.at(i).logprob_bits) << "request " << i;
  }
  EXPECT_GT(spec.n_accepted, 0) << "no draft accepted; the identity proved nothing";
  EXPECT_EQ(kept.peak_local_blocks, 0);
  EXPECT_GT(spec.peak_local_blocks, 0);
  EXPECT_LT(spec.peak_local_blocks, kept.peak_blocks);
  const SpecOutcome full = run_speculative(1, false);  // the window changes the tokens: it is in effect
  EXPECT_NE(full.outputs.at(2).tokens, kept.outputs.at(2).tokens);
}
TEST(EngineSpeculation, Tp2UnevenHeadsGreedyTokensAndLogprobsEqualPlainDecoding) { expect_speculation_identical(2); }

}  // namespace
}  // namespace shardlm
