// The engine over the real model (a small Qwen2.5-7B-shaped random
// checkpoint): continuous batching, chunked prefill, prefix caching and
// preemption must give the same greedy tokens as the model's own one-request
// generate_local, for TP=1 and for a TP x PP group of rank threads.
#include <gtest/gtest.h>

#include <filesystem>
#include <iterator>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "loader/synthetic_checkpoint.h"
#include "model/generate.h"
#include "random_weights.h"

namespace shardlm {
namespace {

std::vector<int32_t> prompt_for(int i, int64_t vocab) {
  std::vector<int32_t> p;
  for (int k = 0; k < 6 + 5 * i; ++k) p.push_back(int32_t((k * 37 + i * 101 + 11) % vocab));
  return p;
}

// Submits a greedy request (EOS ignored) and runs the engine until idle;
// its output tokens.
std::vector<int32_t> greedy_tokens(Engine& engine, const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  std::vector<int32_t> got;
  engine.submit(r, {[&](const SequenceOutput& o) { got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end()); }});
  engine.run_until_idle();
  return got;
}

// A local rank group of tp x pp ranks as these tests run it: blocks of 4
// tokens, an f32 KV cache (the reference's arithmetic), one backend thread
// per rank (OpenMP spinning on a shared 2-core machine costs more than it gives).
LocalGroupOptions f32_group(int tp, int pp, int64_t n_blocks) {
  LocalGroupOptions gopt;
  gopt.layout.tp = tp;
  gopt.layout.pp = pp;
  gopt.n_blocks = n_blocks;
  gopt.block_size = 4;
  gopt.kv_dtype = DType::kF32;
  gopt.n_threads_per_rank = 1;
  return gopt;
}

// Requests 0 .. n-1 (prompt_for(i)) greedy and concurrent, EOS ignored; their output tokens.
std::map<int, std::vector<int32_t>> greedy_batch(Engine& engine, int n, int64_t vocab, int max_tokens) {
  std::map<int, std::vector<int32_t>> got;
  for (int i = 0; i < n; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt_for(i, vocab);
    r.sampling.temperature = 0.0;
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    engine.submit(r, {[&, i](const SequenceOutput& o) {
      got[i].insert(got[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }});
  }
  engine.run_until_idle();
  return got;
}

// in_flight: EngineConfig::max_batches_in_flight (0: the executor's depth, PP).
// Returns the executor's overlapped starts (pipeline stages running
// different batches at the same time).
int64_t run_engine_against_reference(int tp, int pp, int32_t n_blocks, bool expect_preemption, int in_flight = 0) {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  auto weights = testing::random_weights(spec, 3);
  constexpr int kRequests = 5;
  constexpr int kMaxTokens = 6;

  std::map<int, std::vector<int32_t>> want;
  for (int i = 0; i < kRequests; ++i) {
    GenerateOptions opt;
    // PP=2 over the 2 layers: the same arithmetic as one rank, but one backend
    // thread per rank (generate_local gives hw/ranks), which keeps OpenMP from
    // spinning on a busy 2-core machine.
    opt.layout.pp = 2;
    opt.max_tokens = kMaxTokens;
    opt.kv_dtype = DType::kF32;
    opt.block_size = 4;
    want[i] = generate_local(spec, weights, prompt_for(i, spec.vocab_size), opt).tokens;
  }

  LocalGroupOptions gopt = f32_group(tp, pp, n_blocks);
  // With batches in flight, the last stage holds batch 0 done but unreported
  // until rank 0 has taken batch 1: the overlap the pipeline allows is then
  // certain, not left to how the threads happen to run.
  std::mutex overlap_mutex;
  std::condition_variable overlap_cv;
  bool rank0_took_batch1 = false;
  if (pp > 1 && in_flight != 1 && !expect_preemption)
    gopt.batch_hook = [&, last_stage_rank0 = (pp - 1) * tp](int rank, uint64_t batch, bool ran) {
      std::unique_lock<std::mutex> lock(overlap_mutex);
      if (rank == 0 && batch == 1 && !ran) {
        rank0_took_batch1 = true;
        overlap_cv.notify_all();
      } else if (rank >= last_stage_rank0 && batch == 0 && ran) {
        // Bounded: without a second batch in flight the count below fails.
        overlap_cv.wait_for(lock, std::chrono::seconds(60), [&] { return rank0_took_batch1; });
      }
    };
  LocalGroupExecutor executor(spec, weights, gopt);
  EXPECT_GT(executor.kv_block_bytes_rank0(), 0);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = n_blocks + 1;
  EXPECT_THROW({ Engine bad(cfg, executor); }, Error);  // KV geometry must agree with the executor's
  cfg.scheduler.n_blocks = n_blocks;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 16;  // prompts of up to 26 tokens are chunked
  cfg.scheduler.max_model_len = 64;
  cfg.max_batches_in_flight = in_flight;
  Engine engine(cfg, executor);

  std::map<int, std::vector<int32_t>> got;
  std::map<int, FinishReason> finish;
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompt_for(i, spec.vocab_size);
    r.sampling.temperature = 0.0;
    r.stop.max_tokens = kMaxTokens;
    engine.submit(r, {[&, i](const SequenceOutput& o) {
      got[i].insert(got[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished()) finish[i] = o.finish_reason;
    }});
  }
  // The same prompt again: served from the prefix cache.
  EngineRequest again;
  again.request_id = "again";
  again.prompt_token_ids = prompt_for(4, spec.vocab_size);
  again.sampling.temperature = 0.0;
  again.stop.max_tokens = kMaxTokens;
  std::vector<int32_t> again_tokens;
  engine.run_until_idle();
  engine.submit(again, {[&](const SequenceOutput& o) {
    again_tokens.insert(again_tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  }});
  engine.run_until_idle();

  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(got[i], want[i]) << "request " << i << " TP=" << tp << " PP=" << pp;
    EXPECT_EQ(finish[i], FinishReason::kLength);
  }
  EXPECT_EQ(again_tokens, want[4]);
  MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_GE(m.prefix_cache_hits_total, 24);
  if (expect_preemption) {
    EXPECT_GT(m.num_preemptions_total, 0);
  }
  EXPECT_DOUBLE_EQ(m.kv_cache_usage_perc, 0.0);
  if (pp == 1 || in_flight == 1) {
    EXPECT_EQ(m.pipeline_overlapped_batches_total, 0);
  } else {
    EXPECT_GT(m.pipeline_overlapped_batches_total, 0);
  }
  return executor.n_overlapped_starts();
}

TEST(EngineRealModel, Tp1MatchesGenerateLocal) { run_engine_against_reference(1, 1, 64, false); }

TEST(EngineRealModel, TinyPoolWithPreemptionMatchesGenerateLocal) {
  run_engine_against_reference(1, 1, 10, true);  // 40 slots; the longest request needs 32
}

TEST(EngineRealModel, Tp3Pp2MatchesGenerateLocal) { run_engine_against_reference(3, 2, 64, false); }

// LongRoPE (Phi-3-mini-128k's shape, original_max_position_embeddings 12):
// a prompt longer than 12 rotates every position with the long factors,
// though chunked prefill computes its first 12 in a chunk that does not reach
// past them; a shorter one switches at position 12 as it generates; and a long
// prompt that starts with a cached short one's tokens takes none of its
// blocks (their KV is rotated with the short factors). Each must give the
// tokens of its own generate_local, which tests/reference checks against
// transformers' rule.
TEST(EngineRealModel, LongRopeMatchesGenerateLocalUnderChunkingAndPrefixCaching) {
  SyntheticModelOptions so;
  so.like = "phi-3-mini-128k";
  so.n_layers = 2;
  so.vocab_size = 384;
  so.hidden_size = 128;
  so.n_heads = 4;
  so.n_kv_heads = 4;
  so.intermediate_size = 256;
  so.original_max_position = 12;
  so.dtype = DType::kF32;
  const ModelSpec spec = synthetic_model_spec(so);
  ASSERT_EQ(spec.long_rope_from(), 12);
  auto weights = testing::random_weights(spec, 21);
  constexpr int kMaxTokens = 6;
  const std::vector<int32_t> short_prompt = prompt_for(1, spec.vocab_size);  // 11 tokens: switches at 12
  std::vector<int32_t> long_prompt = short_prompt;                           // 16 tokens, the first 11 shared
  for (int32_t t : {5, 77, 200, 31, 9}) long_prompt.push_back(t);
  // The long prompt last again: from the cache of its own chain.
  const std::vector<std::vector<int32_t>> prompts{short_prompt, long_prompt, prompt_for(3, spec.vocab_size),
                                                  long_prompt};

  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) {
    GenerateOptions opt;
    opt.max_tokens = kMaxTokens;
    opt.kv_dtype = DType::kF32;
    opt.block_size = 4;
    want.push_back(generate_local(spec, weights, p, opt).tokens);
  }
  const LocalGroupOptions gopt = f32_group(1, 1, 64);
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 64;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 8;  // the 16- and 21-token prompts in chunks of 8
  cfg.scheduler.max_model_len = 64;
  cfg.scheduler.long_context_after = static_cast<int32_t>(spec.long_rope_from());
  Engine engine(cfg, executor);
  // The short prompt first and alone, so that its blocks are cached when the
  // long one arrives.
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    r.prompt_token_ids = prompts[i];
    r.sampling.temperature = 0.0;
    r.stop.max_tokens = kMaxTokens;
    std::vector<int32_t> got;
    engine.submit(r, {[&](const SequenceOutput& o) {
      got.insert(got.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    }});
    engine.run_until_idle();
    EXPECT_EQ(got, want[i]) << "prompt " << i << " of " << prompts[i].size() << " tokens";
    const int64_t hits = engine.metrics().snapshot().prefix_cache_hits_total;
    if (i < 3) EXPECT_EQ(hits, 0) << "prompt " << i << " took blocks of another rotation";
    else EXPECT_GE(hits, 12) << "the long prompt's second time missed its own cached blocks";
  }
}

// Sliding window on every layer (Mistral v0.1's shape, window 6 over blocks
// of 4): the scheduler releases the blocks that leave the window, so a pool
// of 12 blocks runs sequences of up to 50 tokens (13 blocks of whole past
// each: without the window not one would be admitted), five at once, with
// chunked prefill (chunks of 8), preemption and a prefix hit, at TP 1 and
// at TP 2 with uneven KV heads (3 over 2 ranks) and at PP 2. Tokens must be those of
// generate_local, which keeps every block (its kernels read the window);
// tests/reference checks generate_local against the numpy reference
// (mistral_window_*). Then one long sequence in a big pool: the engine's own
// peak of blocks in use stays at kv's max_blocks_held, not its whole past.
ModelSpec mistral_window_spec(int64_t window) {
  SyntheticModelOptions so;
  so.like = "mistral-7b";
  so.n_layers = 2;
  so.vocab_size = 384;
  so.hidden_size = 96;
  so.n_heads = 6;
  so.n_kv_heads = 3;
  so.intermediate_size = 192;
  so.sliding_window = window;
  so.dtype = DType::kF32;
  return synthetic_model_spec(so);
}

void run_sliding_window_engine(int tp, int pp = 1) {
  const ModelSpec spec = mistral_window_spec(6);
  ASSERT_EQ(spec.sliding_window, 6);
  ASSERT_EQ(spec.sliding_layers, std::vector<bool>(2, true));
  auto weights = testing::random_weights(spec, 5);
  constexpr int kRequests = 5;
  constexpr int kMaxTokens = 24;
  std::map<int, std::vector<int32_t>> want;
  for (int i = 0; i < kRequests; ++i) {
    GenerateOptions opt;
    opt.max_tokens = kMaxTokens;
    opt.kv_dtype = DType::kF32;
    opt.block_size = 4;
    want[i] = generate_local(spec, weights, prompt_for(i, spec.vocab_size), opt).tokens;
    ASSERT_EQ(want[i].size(), size_t(kMaxTokens));
  }

  constexpr int32_t kBlocks = 12;
  const LocalGroupOptions gopt = f32_group(tp, pp, kBlocks);
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = kBlocks;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 8;
  cfg.scheduler.max_model_len = 64;
  cfg.scheduler.sliding_window = 6;
  // The longest request (26 + 24 tokens) needs 13 blocks of whole past: refused without the window.
  SchedulerConfig no_window = cfg.scheduler;
  no_window.sliding_window = 0;
  EXPECT_THROW(Scheduler::check_fits(no_window, 26, kMaxTokens), Error);
  Engine engine(cfg, executor);
  std::map<int, std::vector<int32_t>> got = greedy_batch(engine, kRequests, spec.vocab_size, kMaxTokens);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << " TP=" << tp << " PP=" << pp;
  // Request 1's 11-token prompt twice more: the first time's block 0 leaves
  // the window at its last chunk but stays cached, so the second one hits
  // (11 - 1) / 4 whole blocks. (Behind the five above, the 12-block pool had
  // evicted the head of their chains: a hit needs the chain from block 0.)
  const int64_t hits_before = engine.metrics().snapshot().prefix_cache_hits_total;
  for (int32_t n : {2, kMaxTokens})
    EXPECT_EQ(greedy_tokens(engine, str_cat("again", n), prompt_for(1, spec.vocab_size), n),
              std::vector<int32_t>(want[1].begin(), want[1].begin() + n));
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_EQ(m.prefix_cache_hits_total - hits_before, 8);
  EXPECT_GT(m.num_preemptions_total, 0);
  EXPECT_GT(m.kv_blocks_slid_total, 0);
  EXPECT_NE(engine.metrics().render_prometheus().find("shardlm:kv_blocks_slid_total " +
                                                      std::to_string(m.kv_blocks_slid_total)),
            std::string::npos);
  EXPECT_LE(m.kv_blocks_in_use_peak, kBlocks);
  EXPECT_EQ(m.kv_blocks_in_use, 0);
  EXPECT_DOUBLE_EQ(m.kv_cache_usage_perc, 0.0);
}

TEST(EngineRealModel, SlidingWindowFreesBlocksTp1) { run_sliding_window_engine(1); }
TEST(EngineRealModel, SlidingWindowFreesBlocksTp2UnevenKvHeads) { run_sliding_window_engine(2); }
// Two stages, two micro-batches in flight: a sequence slides only when its own plan lands.
TEST(EngineRealModel, SlidingWindowFreesBlocksPp2) { run_sliding_window_engine(1, 2); }

TEST(EngineRealModel, SlidingWindowBoundsTheBlocksOfOneLongSequence) {
  const ModelSpec spec = mistral_window_spec(6);
  auto weights = testing::random_weights(spec, 5);
  constexpr int kMaxTokens = 40;
  const std::vector<int32_t> prompt = prompt_for(2, spec.vocab_size);  // 16 tokens: 56 in all, 14 blocks
  GenerateOptions opt;
  opt.max_tokens = kMaxTokens;
  opt.kv_dtype = DType::kF32;
  opt.block_size = 4;
  const std::vector<int32_t> want = generate_local(spec, weights, prompt, opt).tokens;
  for (int32_t window : {0, 6}) {  // 0: the scheduler keeps every block (the path before the window freed any)
    const LocalGroupOptions gopt = f32_group(1, 1, 64);
    LocalGroupExecutor executor(spec, weights, gopt);
    EngineConfig cfg;
    cfg.scheduler.n_blocks = 64;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_num_batched_tokens = 8;
    cfg.scheduler.max_model_len = 64;
    cfg.scheduler.sliding_window = window;
    Engine engine(cfg, executor);
    EXPECT_EQ(greedy_tokens(engine, "long", prompt, kMaxTokens), want) << "window " << window;
    const MetricsSnapshot m = engine.metrics().snapshot();
    if (window == 0) {
      EXPECT_EQ(m.kv_blocks_in_use_peak, 14);  // positions 0 .. 54 (the last token is never fed)
      EXPECT_EQ(m.kv_blocks_slid_total, 0);
    } else {
      // Every block but those the last step's window held: 14 - (at most 3) released.
      EXPECT_GE(m.kv_blocks_slid_total, 11);
      // ceil((6 - 1 + 8) / 4) + 1 = 5 (kv's max_blocks_held); a decode holds 2 or 3.
      EXPECT_EQ(max_blocks_held(55, 4, 6, 8), 5);
      EXPECT_LE(m.kv_blocks_in_use_peak, 5);
      EXPECT_GE(m.kv_blocks_in_use_peak, 3);
    }
  }
}

// Gemma 3's shape (tests/reference's gemma3 cases: 6 layers, 0-4 local with
// a window of 5, layer 5 global): the local layers keep their KV in a pool
// of their own, whose blocks leave the window, while the global layer keeps
// every position. Five requests of up to 50 tokens (several windows each)
// in a local pool of 6 blocks (a sequence holds at most 4 there; 13 for its
// whole past), chunked prefill, preemption: the tokens of
// generate_local, which keeps every block in one pool (tests/reference
// checks it against numpy: gemma3_*), at TP 1, TP 3 (4 heads: 2/1/1) and
// PP 2 (stage 0 holds only local layers).
ModelSpec gemma3_hybrid_spec() {
  SyntheticModelOptions so;
  so.like = "gemma-3-1b";
  so.n_layers = 6;
  so.vocab_size = 512;
  so.hidden_size = 320;
  so.n_heads = 4;
  so.n_kv_heads = 1;
  so.head_dim = 64;
  so.intermediate_size = 640;
  so.sliding_window = 5;
  so.tie_word_embeddings = false;
  so.dtype = DType::kF32;
  return synthetic_model_spec(so);
}

void run_gemma3_hybrid_engine(int tp, int pp) {
  const ModelSpec spec = gemma3_hybrid_spec();
  ASSERT_EQ(spec.sliding_window, 5);
  ASSERT_EQ(spec.sliding_layers, (std::vector<bool>{true, true, true, true, true, false}));
  auto weights = testing::random_weights(spec, 9);
  constexpr int kRequests = 5;
  constexpr int kMaxTokens = 24;
  std::map<int, std::vector<int32_t>> want;
  for (int i = 0; i < kRequests; ++i) {
    GenerateOptions opt;
    opt.max_tokens = kMaxTokens;
    opt.kv_dtype = DType::kF32;
    opt.block_size = 4;
    want[i] = generate_local(spec, weights, prompt_for(i, spec.vocab_size), opt).tokens;
    ASSERT_EQ(want[i].size(), size_t(kMaxTokens));
  }
  constexpr int32_t kBlocks = 64, kLocalBlocks = 6;
  LocalGroupOptions gopt = f32_group(tp, pp, kBlocks);
  gopt.n_local_blocks = kLocalBlocks;
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = kBlocks;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 8;
  cfg.scheduler.max_model_len = 64;
  EXPECT_THROW({ Engine bad(cfg, executor); }, Error);  // the local pool must agree with the executor's
  cfg.scheduler.local_sliding_window = 5;
  cfg.scheduler.n_local_blocks = kLocalBlocks;
  EXPECT_EQ(max_blocks_held(49, 4, 5, 8), 4);  // ceil((5 - 1 + 8) / 4) + 1
  Engine engine(cfg, executor);
  std::map<int, std::vector<int32_t>> got = greedy_batch(engine, kRequests, spec.vocab_size, kMaxTokens);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i << " TP=" << tp << " PP=" << pp;
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_GT(m.num_preemptions_total, 0);
  EXPECT_GT(m.kv_blocks_slid_total, 0);
  EXPECT_LE(m.kv_local_blocks_in_use_peak, kLocalBlocks);
  EXPECT_GT(m.kv_blocks_in_use_peak, kLocalBlocks);  // the global layer keeps more than the local pool could
  EXPECT_EQ(m.kv_blocks_in_use, 0);
  EXPECT_EQ(m.kv_local_blocks_in_use, 0);
}

TEST(EngineRealModel, Gemma3LocalLayersInTheirOwnPoolTp1) { run_gemma3_hybrid_engine(1, 1); }
TEST(EngineRealModel, Gemma3LocalLayersInTheirOwnPoolTp3Uneven) { run_gemma3_hybrid_engine(3, 1); }
TEST(EngineRealModel, Gemma3LocalLayersInTheirOwnPoolPp2) { run_gemma3_hybrid_engine(1, 2); }

// One long sequence: the local pool holds at most max_blocks_held (4) blocks,
// the global layer every position's (14), and the tokens are generate's.
// Then its prompt again: a prefix hit of 12 tokens, whose query at 12 reads
// local blocks 2 (8 .. 11) from the cache, and the same tokens.
TEST(EngineRealModel, Gemma3LocalPoolBoundsOneLongSequence) {
  const ModelSpec spec = gemma3_hybrid_spec();
  auto weights = testing::random_weights(spec, 9);
  constexpr int kMaxTokens = 40;
  const std::vector<int32_t> prompt = prompt_for(2, spec.vocab_size);  // 16 tokens: 56 in all
  GenerateOptions opt;
  opt.max_tokens = kMaxTokens;
  opt.kv_dtype = DType::kF32;
  opt.block_size = 4;
  const std::vector<int32_t> want = generate_local(spec, weights, prompt, opt).tokens;
  LocalGroupOptions gopt = f32_group(1, 1, 64);
  gopt.n_local_blocks = 64;
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 64;
  cfg.scheduler.n_local_blocks = 64;
  cfg.scheduler.local_sliding_window = 5;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 8;
  cfg.scheduler.max_model_len = 64;
  Engine engine(cfg, executor);
  EXPECT_EQ(greedy_tokens(engine, "long", prompt, kMaxTokens), want);
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_EQ(m.kv_blocks_in_use_peak, 14);  // positions 0 .. 54
  EXPECT_LE(m.kv_local_blocks_in_use_peak, 4);
  EXPECT_GE(m.kv_local_blocks_in_use_peak, 2);
  EXPECT_GE(m.kv_blocks_slid_total, 10);
  EXPECT_NE(engine.metrics().render_prometheus().find("shardlm:kv_local_blocks_in_use_peak " +
                                                      std::to_string(m.kv_local_blocks_in_use_peak)),
            std::string::npos);
  EXPECT_EQ(greedy_tokens(engine, "again", prompt, 6), std::vector<int32_t>(want.begin(), want.begin() + 6));
  EXPECT_EQ(engine.metrics().snapshot().prefix_cache_hits_total - m.prefix_cache_hits_total, 12);
}

// Micro-batches in flight: with PP stages the engine keeps up to PP batches
// of disjoint sequences moving, so stage 0 starts batch k+1 while stage 1
// still runs batch k; tokens stay those of one batch at a time.
TEST(EngineRealModel, PipelineKeepsStagesBusyWithTheSameTokens) {
  EXPECT_EQ(run_engine_against_reference(1, 2, 64, false, /*in_flight=*/1), 0);
  EXPECT_GT(run_engine_against_reference(1, 2, 64, false), 0);
  EXPECT_GT(run_engine_against_reference(2, 2, 64, false), 0);
}

TEST(EngineRealModel, PipelineWithPreemptionMatchesGenerateLocal) {
  run_engine_against_reference(1, 2, 10, true);
}

// prompt_logprobs against the engine's own generation logprobs: greedy
// tokens G after prompt P, with their logprobs; then P + G as a prompt with
// prompt_logprobs. The prompt logprobs at G's positions must be the
// generation logprobs (the same logits: one computed at the last position of
// a decode step, the other inside a prefill chunk) with rank 1 and G's token
// first in the top. Few logit rows per step (3) force the prompt through
// several bounded chunks, and the prefix cache, which holds P + G's blocks
// from the first request, must not serve the second one.
void check_prompt_logprobs_match_generation(int tp, int pp) {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  auto weights = testing::random_weights(spec, 3);
  const LocalGroupOptions gopt = f32_group(tp, pp, 64);
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 64;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 16;
  cfg.scheduler.max_model_len = 64;
  cfg.scheduler.max_prompt_logit_rows = 3;
  cfg.prompt_logits_bytes = 0;  // keep the 3 above
  Engine engine(cfg, executor);

  const std::vector<int32_t> prompt = prompt_for(1, spec.vocab_size);  // 11 tokens
  constexpr int kGenerated = 6;
  EngineRequest gen;
  gen.request_id = "gen";
  gen.prompt_token_ids = prompt;
  gen.sampling.temperature = 0.0;
  gen.sampling.logprobs = 2;
  gen.logprobs = true;
  gen.stop.max_tokens = kGenerated;
  gen.stop.ignore_eos = true;
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> gen_lp;
  engine.submit(gen, {[&](const SequenceOutput& o) {
    tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    gen_lp.insert(gen_lp.end(), o.logprobs.begin(), o.logprobs.end());
    EXPECT_TRUE(o.prompt_logprobs.empty());  // not asked for
  }});
  engine.run_until_idle();
  ASSERT_EQ(tokens.size(), size_t(kGenerated));
  ASSERT_EQ(gen_lp.size(), size_t(kGenerated));

  EngineRequest score;
  score.request_id = "score";
  score.prompt_token_ids = prompt;
  score.prompt_token_ids.insert(score.prompt_token_ids.end(), tokens.begin(), tokens.end());
  score.sampling.temperature = 0.0;
  score.prompt_logprobs = 4;
  score.stop.max_tokens = 1;
  score.n = 2;  // the sibling shares the prompt; only sequence 0 reports its logprobs
  std::vector<TokenLogprobs> prompt_lp;
  int n_outputs_with_prompt = 0;
  int32_t cached = -1;
  engine.submit(score, {[&](const SequenceOutput& o) {
    if (!o.prompt_logprobs.empty()) {
      ++n_outputs_with_prompt;
      EXPECT_EQ(o.index, 0);
      prompt_lp = o.prompt_logprobs;
    }
    if (o.index == 0) cached = o.n_cached_tokens;
  }});
  engine.run_until_idle();
  EXPECT_EQ(n_outputs_with_prompt, 1);
  EXPECT_EQ(cached, 0) << "the prompt-logprobs sequence took prefix-cache hits";
  const std::vector<int32_t>& all = score.prompt_token_ids;
  ASSERT_EQ(prompt_lp.size(), all.size() - 1);
  for (size_t i = 0; i < prompt_lp.size(); ++i) {
    const TokenLogprobs& lp = prompt_lp[i];
    EXPECT_EQ(lp.token_id, all[i + 1]) << "entry " << i;
    ASSERT_EQ(lp.top.size(), 4u);
    EXPECT_GE(lp.rank, 1);
    EXPECT_LE(lp.logprob, 0.0f);
    for (size_t j = 1; j < lp.top.size(); ++j) EXPECT_GE(lp.top[j - 1].logprob, lp.top[j].logprob);
    EXPECT_GE(lp.top[0].logprob, lp.logprob);
    if (lp.rank == 1) {
      EXPECT_EQ(lp.top[0].token, lp.token_id);
    }
    if (lp.rank <= 4) {
      EXPECT_EQ(lp.top[size_t(lp.rank) - 1].token, lp.token_id) << "entry " << i;  // no ties in random weights
    }
  }
  for (int j = 0; j < kGenerated; ++j) {
    const TokenLogprobs& p = prompt_lp[prompt.size() - 1 + j];  // the entry of token prompt.size() + j
    EXPECT_EQ(p.token_id, tokens[j]);
    EXPECT_NEAR(p.logprob, gen_lp[j].logprob, 1e-4) << "generated token " << j << " TP=" << tp << " PP=" << pp;
    EXPECT_EQ(p.rank, 1) << "greedy token " << j;
    EXPECT_EQ(gen_lp[j].rank, 1);
    ASSERT_EQ(gen_lp[j].top.size(), 2u);
    for (size_t t = 0; t < 2; ++t) {
      EXPECT_EQ(p.top[t].token, gen_lp[j].top[t].token);
      EXPECT_NEAR(p.top[t].logprob, gen_lp[j].top[t].logprob, 1e-4);
    }
  }
  EXPECT_DOUBLE_EQ(engine.metrics().snapshot().kv_cache_usage_perc, 0.0);
}

TEST(EngineRealModel, PromptLogprobsMatchGenerationLogprobs) { check_prompt_logprobs_match_generation(1, 1); }

// The vocab-sharded lm_head (TP) gathers every prompt row, and a pipeline
// (PP) sends them from its last stage, micro-batches in flight.
TEST(EngineRealModel, PromptLogprobsMatchGenerationLogprobsTp2Pp2) { check_prompt_logprobs_match_generation(2, 2); }

TEST(EngineRealModel, ExecutorRejectsBadLayout) {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  LocalGroupOptions gopt;
  gopt.layout.tp = 1;
  gopt.layout.dp = 2;
  gopt.n_blocks = 8;
  auto w = testing::random_weights(spec, 3);
  EXPECT_THROW({ LocalGroupExecutor e(spec, w, gopt); }, Error);
}

// serve's engine on CPU (EngineConfig::host_threads = 1, host_workers = 1)
// samples without an OpenMP team of its own: a second team makes libgomp throttle the rank
// team's spin-waits for the life of the process (engine.h). Counted as the
// threads a fresh host thread adds while it runs sampled steps: itself only,
// where a team of its own would add a pooled OpenMP worker that outlives the
// step (seen: 5 threads for 4 with host_threads = 0).
TEST(EngineRealModel, CpuHostWorkStartsNoOpenMpTeamOfItsOwn) {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  auto weights = testing::random_weights(spec, 5);
  LocalGroupOptions gopt = f32_group(1, 1, 64);
  gopt.n_threads_per_rank = 2;  // the rank's own team: the one that should stay alone
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 64;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_model_len = 64;
  cfg.parallel_sampling_min_work = 0;  // every step's rows take the parallel sampling loop
  cfg.host_threads = 1;
  cfg.host_workers = 1;  // as serve sets it: plain threads, started with the engine, no team either
  Engine engine(cfg, executor);
  auto n_threads = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator{});
  };
  EXPECT_EQ(greedy_tokens(engine, "warm", prompt_for(0, spec.vocab_size), 2).size(), 2u);  // the rank's team exists now
  const auto before = n_threads();
  std::ptrdiff_t during = 0;
  int64_t sampled = 0;
  std::thread host([&] {
    for (int i = 0; i < 4; ++i) {
      EngineRequest r;
      r.request_id = "s" + std::to_string(i);
      r.prompt_token_ids = prompt_for(i, spec.vocab_size);
      r.sampling.temperature = 1.0;
      r.sampling.seed = 7 + i;
      r.stop.max_tokens = 4;
      r.stop.ignore_eos = true;
      engine.submit(r, {[&](const SequenceOutput& o) { sampled += static_cast<int64_t>(o.new_token_ids.size()); }});
    }
    engine.run_until_idle();
    during = n_threads();  // before this thread ends: a pool of its own would still be here
  });
  host.join();
  EXPECT_EQ(sampled, 16);
  EXPECT_EQ(during, before + 1) << "the host thread's sampling started threads of its own (an OpenMP team?)";
}

// The rows a step samples on the engine's host workers (serve on the CPU)
// give the tokens the single-threaded loop gives: each row's sampler is its
// sequence's own, seeded, whichever thread runs it.
TEST(EngineRealModel, HostWorkersSampleTheTokensOfOneThread) {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  auto weights = testing::random_weights(spec, 5);
  auto run = [&](int32_t workers) {
    LocalGroupOptions gopt;
    gopt.n_blocks = 64;
    gopt.block_size = 4;
    gopt.kv_dtype = DType::kF32;
    LocalGroupExecutor executor(spec, weights, gopt);
    EngineConfig cfg;
    cfg.scheduler.n_blocks = 64;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_model_len = 64;
    cfg.parallel_sampling_min_work = 0;
    cfg.host_threads = 1;
    cfg.host_workers = workers;
    Engine engine(cfg, executor);
    std::vector<std::vector<int32_t>> out(6);
    for (int i = 0; i < 6; ++i) {
      EngineRequest r;
      r.request_id = "s" + std::to_string(i);
      r.prompt_token_ids = prompt_for(i, spec.vocab_size);
      r.sampling.temperature = 1.0;
      r.sampling.top_p = i % 2 ? 0.9 : 1.0;
      r.sampling.seed = 11 + i;
      r.stop.max_tokens = 5;
      r.stop.ignore_eos = true;
      engine.submit(r, {[&out, i](const SequenceOutput& o) {
                      out[size_t(i)].insert(out[size_t(i)].end(), o.new_token_ids.begin(), o.new_token_ids.end());
                    }});
    }
    engine.run_until_idle();
    return out;
  };
  const auto alone = run(0), pooled = run(2);
  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_EQ(alone[i].size(), 5u);
    EXPECT_EQ(pooled[i], alone[i]) << "request " << i;
  }
}

// collect_into hands over the buffer the last stage wrote the logits into
// and keeps the caller's as the group's next spare, so a step moves no
// [rows, vocab] copy (9.7 MB at 16 rows of a 152K vocabulary): the caller's
// vector comes back holding the group's buffer, then its own old one, with
// the logits that collect() copies out. At PP = 2 too, where two buffers are
// in flight.
TEST(EngineRealModel, CollectIntoHandsOverTheLogitsBufferWithoutACopy) {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  auto weights = testing::random_weights(spec, 5);
  for (int pp : {1, 2}) {
    LocalGroupExecutor executor(spec, weights, f32_group(1, pp, 16));
    ForwardBatch b;  // one 6-token prompt in blocks 0 and 1, its last row's logits
    b.token_ids = {3, 141, 59, 26, 5, 35};
    b.seqs.resize(1);
    b.seqs[0].n_tokens = 6;
    b.seqs[0].block_table = {0, 1};
    b.seqs[0].need_logits = true;
    std::vector<float> want(size_t(spec.vocab_size));
    executor.execute(b, want.data());  // the copying path, run once more each time below (the same KV is rewritten)
    std::vector<float> mine(want.size(), -1.0f);
    const float* own = mine.data();
    executor.submit(b);
    executor.collect_into(mine, 1);
    EXPECT_NE(mine.data(), own) << "pp " << pp << ": collect_into copied into the caller's buffer";
    EXPECT_EQ(mine, want) << "pp " << pp;
    executor.submit(b);
    executor.collect_into(mine, 1);
    EXPECT_EQ(mine.data(), own) << "pp " << pp << ": the caller's old buffer was not the group's next spare";
    EXPECT_EQ(mine, want) << "pp " << pp;
  }
}

}  // namespace
}  // namespace shardlm
