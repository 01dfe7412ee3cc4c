#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "grammar/grammar_compiler.h"
#include <nlohmann/json.hpp>
#include "fake_model.h"

namespace shardlm {
namespace {

using testing::FakeModel;
using testing::reference_greedy;
using testing::ToyDetokenizer;
using testing::toy_text;

constexpr int64_t kVocab = 64;

struct SeqResult {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  std::string error;
  int n_callbacks = 0;
  int n_final = 0;
  SequenceOutput last;
  std::vector<TokenLogprobs> logprobs;
  std::vector<TokenLogprobs> prompt_logprobs;
  int n_prompt_logprobs_outputs = 0;  // outputs that carried them
};

// Gathers every callback (thread-safe: callbacks come from the engine thread).
class Collector {
 public:
  RequestCallbacks callbacks() {
    return {[this](const SequenceOutput& o) {
      std::lock_guard<std::mutex> lock(mutex_);
      SeqResult& r = results_[{o.request_id, o.index}];
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      r.text += o.text_delta;
      r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (!o.prompt_logprobs.empty()) {
        r.prompt_logprobs = o.prompt_logprobs;
        ++r.n_prompt_logprobs_outputs;
      }
      ++r.n_callbacks;
      if (o.finished()) {
        ++r.n_final;
        r.finish = o.finish_reason;
        r.stop_string = o.stop_string;
        r.stop_token = o.stop_token_id;
        r.error = o.error;
      }
      r.last = o;
      if (o.request_finished) {
        ++n_requests_finished_;
        cv_.notify_all();
      }
    }};
  }
  SeqResult get(const std::string& id, int index = 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    return results_[{id, index}];
  }
  bool wait_finished(int n, std::chrono::seconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return n_requests_finished_ >= n; });
  }
  int n_finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    return n_requests_finished_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::pair<std::string, int>, SeqResult> results_;
  int n_requests_finished_ = 0;
};

EngineConfig config(int32_t n_blocks = 256, int32_t budget = 64) {
  EngineConfig c;
  c.scheduler.n_blocks = n_blocks;
  c.scheduler.block_size = 4;
  c.scheduler.max_num_seqs = 64;
  c.scheduler.max_num_batched_tokens = budget;
  c.scheduler.max_model_len = 512;
  return c;  // no EOS unless a test sets one
}

std::vector<int32_t> make_prompt(int32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(rng() % kVocab);
  return p;
}

EngineRequest greedy(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

FakeModel make_model(const EngineConfig& c, int depth) {
  FakeModel m(kVocab, c.scheduler.n_blocks, c.scheduler.block_size);
  m.depth = depth;
  return m;
}

struct Fixture {
  // depth > 1: the model is a pipeline of that many stages.
  explicit Fixture(EngineConfig c, bool detok = true, int depth = 1)
      : cfg(c), model(make_model(c, depth)), engine(c, model, detok ? &toy : nullptr) {}
  EngineConfig cfg;
  FakeModel model;
  ToyDetokenizer toy;
  Collector out;  // outlives the engine, whose destructor may still call back
  Engine engine;
};

void expect_clean(Fixture& f) {
  EXPECT_TRUE(f.model.errors.empty()) << f.model.errors.front();
  MetricsSnapshot m = f.engine.metrics().snapshot();
  EXPECT_EQ(m.num_requests_running, 0);
  EXPECT_EQ(m.num_requests_waiting, 0);
  EXPECT_DOUBLE_EQ(m.kv_cache_usage_perc, 0.0);
  EXPECT_EQ(f.engine.scheduler().pool().n_used(), 0);
}

TEST(Engine, GreedyMatchesReference) {
  Fixture f(config());
  auto prompt = make_prompt(23, 1);
  f.engine.submit(greedy("a", prompt, 12), f.out.callbacks());
  f.engine.run_until_idle();
  SeqResult r = f.out.get("a");
  EXPECT_EQ(r.tokens, reference_greedy(prompt, 12, kVocab));
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.n_final, 1);
  EXPECT_EQ(r.n_callbacks, 12);  // one per token, the last one carries the finish
  EXPECT_EQ(r.text, toy_text(r.tokens));
  EXPECT_EQ(r.last.n_prompt_tokens, 23);
  EXPECT_EQ(r.last.n_completion_tokens, 12);
  EXPECT_TRUE(r.last.request_finished);
  EXPECT_GE(r.last.time_to_first_token_s, 0.0);
  EXPECT_GE(r.last.elapsed_s, r.last.time_to_first_token_s);
  MetricsSnapshot m = f.engine.metrics().snapshot();
  EXPECT_EQ(m.prompt_tokens_total, 23);
  EXPECT_EQ(m.generation_tokens_total, 12);
  EXPECT_EQ(m.time_to_first_token_seconds.count, 1u);
  EXPECT_EQ(m.inter_token_latency_seconds.count, 11u);
  EXPECT_EQ(m.e2e_request_latency_seconds.count, 1u);
  EXPECT_EQ(m.request_success_total["length"], 1);
  expect_clean(f);
}

TEST(Engine, BatchInvarianceGreedyAloneOrAmong32) {
  auto prompt = make_prompt(37, 7);
  std::vector<int32_t> alone;
  {
    Fixture f(config());
    f.engine.submit(greedy("x", prompt, 20), f.out.callbacks());
    f.engine.run_until_idle();
    alone = f.out.get("x").tokens;
    expect_clean(f);
  }
  Fixture f(config(512, 128));
  for (int i = 0; i < 16; ++i) f.engine.submit(greedy("o" + std::to_string(i), make_prompt(5 + i * 3, 100 + i), 10 + i), f.out.callbacks());
  f.engine.run_step();  // others are already running when x arrives
  f.engine.submit(greedy("x", prompt, 20), f.out.callbacks());
  for (int i = 16; i < 32; ++i) f.engine.submit(greedy("o" + std::to_string(i), make_prompt(5 + i * 3, 100 + i), 10 + i), f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("x").tokens, alone);
  EXPECT_EQ(alone, reference_greedy(prompt, 20, kVocab));
  for (int i = 0; i < 32; ++i)
    EXPECT_EQ(f.out.get("o" + std::to_string(i)).tokens, reference_greedy(make_prompt(5 + i * 3, 100 + i), 10 + i, kVocab));
  EXPECT_GT(*std::max_element(f.model.batch_sizes.begin(), f.model.batch_sizes.end()), 20);
  expect_clean(f);
}

TEST(Engine, ChunkedPrefillSharesStepsWithDecodesWithinBudget) {
  Fixture f(config(256, 32));
  f.engine.submit(greedy("short", make_prompt(5, 2), 40), f.out.callbacks());
  f.engine.run_step();
  f.engine.run_step();
  auto long_prompt = make_prompt(300, 3);
  f.engine.submit(greedy("long", long_prompt, 5), f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_LE(f.model.max_batch_tokens, 32);
  EXPECT_GE(f.model.n_mixed_steps, 8);  // ~300/31 chunks, each next to the short decode
  EXPECT_EQ(f.out.get("long").tokens, reference_greedy(long_prompt, 5, kVocab));
  EXPECT_EQ(f.out.get("short").tokens, reference_greedy(make_prompt(5, 2), 40, kVocab));
  expect_clean(f);
}

std::map<std::string, std::vector<int32_t>> run_pressure(int32_t n_blocks, int64_t* n_preempt) {
  Fixture f(config(n_blocks, 64));
  std::map<std::string, std::vector<int32_t>> got;
  for (int i = 0; i < 8; ++i) f.engine.submit(greedy("r" + std::to_string(i), make_prompt(10 + 7 * i, 50 + i), 40), f.out.callbacks());
  f.engine.run_until_idle();
  for (int i = 0; i < 8; ++i) {
    SeqResult r = f.out.get("r" + std::to_string(i));
    EXPECT_EQ(r.n_final, 1);
    EXPECT_EQ(r.finish, FinishReason::kLength);
    EXPECT_EQ(r.text, toy_text(r.tokens));
    got["r" + std::to_string(i)] = r.tokens;
  }
  *n_preempt = f.engine.metrics().snapshot().num_preemptions_total;
  expect_clean(f);
  return got;
}

TEST(Engine, PreemptionUnderTinyPoolKeepsOutputsIdentical) {
  int64_t n0 = 0, n1 = 0;
  auto ref = run_pressure(512, &n0);
  EXPECT_EQ(n0, 0);
  auto got = run_pressure(26, &n1);  // 104 slots; the largest request needs 98
  EXPECT_GT(n1, 0);
  EXPECT_EQ(ref, got);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ref["r" + std::to_string(i)], reference_greedy(make_prompt(10 + 7 * i, 50 + i), 40, kVocab));
}

TEST(Engine, RejectsWhatCanNeverFitWithTheNumbers) {
  Fixture f(config(8));  // 32 slots
  try {
    f.engine.submit(greedy("big", make_prompt(30, 1), 10), f.out.callbacks());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("30 prompt + 10 max_tokens"), std::string::npos) << e.what();
  }
  EngineRequest bad = greedy("bad", {1, 2, 99}, 4);
  EXPECT_THROW(f.engine.submit(bad, f.out.callbacks()), Error);
  bad = greedy("bad", {1, 2}, 4);
  bad.sampling.top_p = 0.0;
  EXPECT_THROW(f.engine.submit(bad, f.out.callbacks()), Error);
  bad = greedy("bad", {1, 2}, 4);
  bad.stop.min_tokens = 5;
  EXPECT_THROW(f.engine.submit(bad, f.out.callbacks()), Error);
  f.engine.submit(greedy("dup", {1, 2}, 4), f.out.callbacks());
  EXPECT_THROW(f.engine.submit(greedy("dup", {1, 2}, 4), f.out.callbacks()), Error);
  f.engine.run_until_idle();
  f.engine.submit(greedy("dup", {1, 2}, 4), f.out.callbacks());  // finished ids are free again
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("dup").tokens.size(), 8u);
}

TEST(Engine, AbortFreesBlocksAndMetricsReturnToZero) {
  Fixture f(config(64, 16));
  for (int i = 0; i < 6; ++i) f.engine.submit(greedy("r" + std::to_string(i), make_prompt(20, i), 100), f.out.callbacks());
  for (int i = 0; i < 5; ++i) f.engine.run_step();
  MetricsSnapshot m = f.engine.metrics().snapshot();
  EXPECT_GT(m.num_requests_running, 0);
  EXPECT_GT(m.kv_cache_usage_perc, 0.0);
  const int32_t used_before = f.engine.scheduler().pool().n_used();
  f.engine.abort("r0");
  f.engine.abort("nope");  // unknown: ignored
  f.engine.run_step();
  EXPECT_LT(f.engine.scheduler().pool().n_used(), used_before + 2);
  SeqResult r0 = f.out.get("r0");
  EXPECT_EQ(r0.finish, FinishReason::kAbort);
  EXPECT_EQ(r0.n_final, 1);
  EXPECT_TRUE(r0.last.request_finished);
  for (int i = 1; i < 6; ++i) f.engine.abort("r" + std::to_string(i));
  f.engine.run_step();
  for (int i = 1; i < 6; ++i) EXPECT_EQ(f.out.get("r" + std::to_string(i)).finish, FinishReason::kAbort);
  expect_clean(f);
  EXPECT_EQ(f.engine.metrics().snapshot().request_success_total["abort"], 6);
  f.engine.abort("r1");  // already gone: no second final callback
  f.engine.run_step();
  EXPECT_EQ(f.out.get("r1").n_final, 1);
}

TEST(Engine, NSequencesShareThePromptBlocks) {
  Fixture f(config());
  auto prompt = make_prompt(41, 9);  // 10 full blocks of 4
  EngineRequest r = greedy("n", prompt, 6);
  r.n = 3;
  f.engine.submit(r, f.out.callbacks());
  f.engine.run_until_idle();
  auto ref = reference_greedy(prompt, 6, kVocab);
  for (int i = 0; i < 3; ++i) {
    SeqResult s = f.out.get("n", i);
    EXPECT_EQ(s.tokens, ref) << i;
    EXPECT_EQ(s.n_final, 1);
  }
  EXPECT_EQ(int(f.out.get("n", 0).last.request_finished) + int(f.out.get("n", 1).last.request_finished) +
                int(f.out.get("n", 2).last.request_finished), 1);
  MetricsSnapshot m = f.engine.metrics().snapshot();
  EXPECT_EQ(m.prefix_cache_hits_total, 2 * 40);
  EXPECT_EQ(m.prefix_cache_queries_total, 3 * 41);
  EXPECT_EQ(m.prompt_tokens_total, 41);
  EXPECT_EQ(m.generation_tokens_total, 18);
  expect_clean(f);

  // Sampled siblings differ from each other (distinct seeds per sequence).
  EngineRequest s = r;
  s.request_id = "ns";
  s.sampling.temperature = 1.0f;
  s.sampling.seed = 5;
  s.stop.max_tokens = 30;
  f.engine.submit(s, f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_NE(f.out.get("ns", 0).tokens, f.out.get("ns", 1).tokens);
  EXPECT_EQ(f.out.get("ns", 2).tokens.size(), 30u);
}

TEST(Engine, PrefixCacheAcrossRequests) {
  Fixture f(config());
  auto prompt = make_prompt(30, 4);
  f.engine.submit(greedy("a", prompt, 3), f.out.callbacks());
  f.engine.run_until_idle();
  f.engine.submit(greedy("b", prompt, 3), f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("a").tokens, f.out.get("b").tokens);
  EXPECT_EQ(f.out.get("b").last.n_cached_tokens, 28);
  MetricsSnapshot m = f.engine.metrics().snapshot();
  EXPECT_EQ(m.prefix_cache_queries_total, 60);
  EXPECT_EQ(m.prefix_cache_hits_total, 28);
  expect_clean(f);
}

TEST(Engine, StopStringsEndTheTextBeforeTheMatch) {
  auto prompt = make_prompt(10, 11);
  auto ref = reference_greedy(prompt, 40, kVocab);
  std::string full = toy_text(ref);
  // A stop string from the middle of the reference text (ASCII part, 3 bytes).
  size_t pos = std::string::npos;
  for (size_t i = 8; i + 3 < full.size(); ++i)
    if (std::isalpha((unsigned char)full[i]) && std::isalpha((unsigned char)full[i + 1]) && std::isalpha((unsigned char)full[i + 2])) {
      pos = i;
      break;
    }
  ASSERT_NE(pos, std::string::npos);
  const std::string stop = full.substr(pos, 3);
  const size_t first = full.find(stop);
  for (bool include : {false, true}) {
    Fixture f(config());
    EngineRequest r = greedy("s", prompt, 40);
    r.stop.stop = {"never-there", stop};
    r.stop.include_stop_str_in_output = include;
    f.engine.submit(r, f.out.callbacks());
    f.engine.run_until_idle();
    SeqResult s = f.out.get("s");
    EXPECT_EQ(s.finish, FinishReason::kStop);
    ASSERT_TRUE(s.stop_string);
    EXPECT_EQ(*s.stop_string, stop);
    EXPECT_EQ(s.text, full.substr(0, include ? first + 3 : first));
    EXPECT_LT(s.tokens.size(), 40u);
    expect_clean(f);
  }
}

TEST(Engine, StopTokensMinTokensIgnoreEos) {
  auto prompt = make_prompt(12, 21);
  auto ref = reference_greedy(prompt, 30, kVocab);
  const int32_t eos = ref[3];
  const size_t first_eos = std::find(ref.begin(), ref.end(), eos) - ref.begin();
  {
    EngineConfig c = config();
    c.eos_token_ids = {eos};
    Fixture f(c);
    EngineRequest r = greedy("e", prompt, 30);
    r.stop.ignore_eos = false;
    f.engine.submit(r, f.out.callbacks());
    EngineRequest ig = greedy("ig", prompt, 30);  // ignore_eos
    f.engine.submit(ig, f.out.callbacks());
    f.engine.run_until_idle();
    SeqResult e = f.out.get("e");
    EXPECT_EQ(e.finish, FinishReason::kStop);
    EXPECT_EQ(e.stop_token, eos);
    EXPECT_EQ(e.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + first_eos + 1));
    EXPECT_EQ(e.text, toy_text(std::vector<int32_t>(ref.begin(), ref.begin() + first_eos)));  // EOS adds no text
    SeqResult i = f.out.get("ig");
    EXPECT_EQ(i.tokens, ref);
    EXPECT_EQ(i.finish, FinishReason::kLength);
    expect_clean(f);
  }
  {
    Fixture f(config());
    EngineRequest r = greedy("m", prompt, 30);
    r.stop.stop_token_ids = {eos};
    r.stop.min_tokens = int32_t(first_eos) + 2;
    f.engine.submit(r, f.out.callbacks());
    f.engine.run_until_idle();
    SeqResult m = f.out.get("m");
    // The stop token is banned until min_tokens, so the text diverges from the reference there.
    ASSERT_GE(m.tokens.size(), size_t(r.stop.min_tokens));
    EXPECT_EQ(std::vector<int32_t>(m.tokens.begin(), m.tokens.begin() + first_eos),
              std::vector<int32_t>(ref.begin(), ref.begin() + first_eos));
    for (int32_t k = 0; k < r.stop.min_tokens; ++k) EXPECT_NE(m.tokens[k], eos);
    EXPECT_TRUE(m.finish == FinishReason::kLength || (m.finish == FinishReason::kStop && m.tokens.back() == eos));
  }
}

TEST(Engine, SeededSamplingReproducibleAcrossBatchCompositions) {
  auto prompt = make_prompt(17, 33);
  auto sampled = [&](int n_others, bool tiny_pool) {
    Fixture f(config(tiny_pool ? 20 : 256, 64));
    for (int i = 0; i < n_others; ++i) {
      EngineRequest o = greedy("o" + std::to_string(i), make_prompt(9 + i, 200 + i), 25);
      o.sampling.temperature = 0.8f;
      f.engine.submit(o, f.out.callbacks());
    }
    EngineRequest r = greedy("s", prompt, 25);
    r.sampling.temperature = 1.0f;
    r.sampling.top_p = 0.9f;
    r.sampling.top_k = 20;
    r.sampling.min_p = 0.01f;
    r.sampling.presence_penalty = 0.5f;
    r.sampling.frequency_penalty = 0.3f;
    r.sampling.repetition_penalty = 1.2f;
    r.sampling.seed = 1234;
    f.engine.submit(r, f.out.callbacks());
    f.engine.run_until_idle();
    EXPECT_TRUE(f.model.errors.empty());
    return f.out.get("s").tokens;
  };
  auto alone = sampled(0, false);
  EXPECT_EQ(alone.size(), 25u);
  EXPECT_EQ(sampled(7, false), alone);
  EXPECT_EQ(sampled(7, true), alone);  // with preemptions
  EXPECT_NE(alone, reference_greedy(prompt, 25, kVocab));
}

TEST(Engine, ParallelSamplingGivesTheSerialTokensAndLogprobs) {
  // Eight sampled sequences with their own seeds, penalties and logprobs,
  // plus a greedy one: rows sampled by an OpenMP team must match rows
  // sampled one after another.
  auto run = [](int64_t min_work) {
    EngineConfig c = config();
    c.parallel_sampling_min_work = min_work;
    Fixture f(c);
    for (int i = 0; i < 9; ++i) {
      EngineRequest r = greedy("s" + std::to_string(i), make_prompt(5 + i, 40 + i), 12);
      if (i > 0) {
        r.sampling.temperature = 0.6 + 0.1 * i;
        r.sampling.top_p = 0.9;
        r.sampling.top_k = i % 3 == 0 ? 10 : -1;
        r.sampling.frequency_penalty = 0.2;
        r.sampling.seed = 100 + i;
      }
      r.logprobs = i % 2 == 0;
      r.sampling.logprobs = i % 2 == 0 ? 2 : 0;
      f.engine.submit(r, f.out.callbacks());
    }
    f.engine.run_until_idle();
    EXPECT_TRUE(f.model.errors.empty());
    std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> got;
    for (int i = 0; i < 9; ++i) {
      SeqResult s = f.out.get("s" + std::to_string(i));
      std::vector<float> lps;
      for (const auto& lp : s.logprobs) lps.push_back(lp.logprob);
      got.emplace_back(s.tokens, lps);
    }
    return got;
  };
  const auto serial = run(int64_t(1) << 40);
  const auto parallel = run(0);
  ASSERT_EQ(serial.size(), parallel.size());
  for (size_t i = 0; i < serial.size(); ++i) {
    EXPECT_EQ(serial[i].first.size(), 12u) << i;
    EXPECT_EQ(serial[i].first, parallel[i].first) << i;
    EXPECT_EQ(serial[i].second, parallel[i].second) << i;
    EXPECT_EQ(serial[i].second.size(), i % 2 == 0 ? 12u : 0u) << i;
  }
}

TEST(Engine, LogprobsOfTheRawDistribution) {
  Fixture f(config());
  EngineRequest r = greedy("l", make_prompt(6, 8), 5);
  r.logprobs = true;
  r.sampling.logprobs = 3;
  f.engine.submit(r, f.out.callbacks());
  f.engine.run_until_idle();
  SeqResult s = f.out.get("l");
  ASSERT_EQ(s.logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const TokenLogprobs& lp = s.logprobs[i];
    EXPECT_EQ(lp.token_id, s.tokens[i]);
    EXPECT_EQ(lp.rank, 1);  // greedy
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].token, lp.token_id);
    EXPECT_FLOAT_EQ(lp.top[0].logprob, lp.logprob);
    EXPECT_LT(lp.logprob, 0.0f);
    EXPECT_GE(lp.top[0].logprob, lp.top[1].logprob);
    EXPECT_GE(lp.top[1].logprob, lp.top[2].logprob);
  }
}

// prompt_logprobs against the fake model's own rows (a function of the
// context up to each position, sharing no code with the engine): each prompt
// token's raw log_softmax, vLLM's rank (tokens at least as likely) and the
// top k. Under a pool so small that sequences are preempted and recomputed,
// with 2 rows per step, n = 2 (only sequence 0 reports them) and one prompt
// cached by an earlier request (a prefix hit would leave its entries empty).
TEST(Engine, PromptLogprobsAreTheModelsThroughPreemptionAndChunks) {
  EngineConfig c = config(/*n_blocks=*/24, /*budget=*/16);
  c.scheduler.max_prompt_logit_rows = 2;
  c.prompt_logits_bytes = 0;
  Fixture f(c);
  const auto cached = make_prompt(30, 99);
  f.engine.submit(greedy("warm", cached, 2), f.out.callbacks());
  f.engine.run_until_idle();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(i == 0 ? cached : make_prompt(20 + 5 * i, 70 + i));
    EngineRequest r = greedy("p" + std::to_string(i), prompts.back(), 12);
    r.prompt_logprobs = i % 3;  // 0, 1, 2, 0 alternatives
    r.n = i == 1 ? 2 : 1;
    f.engine.submit(r, f.out.callbacks());
  }
  f.engine.submit(greedy("plain", make_prompt(40, 5), 30), f.out.callbacks());  // pressure
  f.engine.run_until_idle();
  EXPECT_GT(f.engine.metrics().snapshot().num_preemptions_total, 0);
  EXPECT_EQ(f.model.max_logit_rows, 2);
  for (int i = 0; i < 4; ++i) {
    const std::string id = "p" + std::to_string(i);
    const auto& prompt = prompts[size_t(i)];
    SeqResult s = f.out.get(id);
    EXPECT_EQ(s.tokens, reference_greedy(prompt, 12, kVocab)) << id;
    EXPECT_EQ(s.n_prompt_logprobs_outputs, 1) << id;
    if (i == 1) {
      EXPECT_EQ(f.out.get(id, 1).n_prompt_logprobs_outputs, 0);
    }
    ASSERT_EQ(s.prompt_logprobs.size(), prompt.size() - 1) << id;
    std::vector<float> row(kVocab);
    for (size_t p = 1; p < prompt.size(); ++p) {
      testing::fill_logits(testing::context_hash(std::span<const int32_t>(prompt.data(), p)), row.data(), kVocab);
      double z = 0.0;
      float mx = *std::max_element(row.begin(), row.end());
      for (float x : row) z += std::exp(double(x) - mx);
      const int32_t tok = prompt[p];
      const TokenLogprobs& lp = s.prompt_logprobs[p - 1];
      EXPECT_EQ(lp.token_id, tok);
      EXPECT_NEAR(lp.logprob, double(row[tok]) - mx - std::log(z), 1e-5) << id << " position " << p;
      EXPECT_EQ(lp.rank, std::count_if(row.begin(), row.end(), [&](float x) { return x >= row[tok]; })) << id << " " << p;
      ASSERT_EQ(lp.top.size(), size_t(i % 3));
      if (!lp.top.empty()) {
        EXPECT_EQ(lp.top[0].token, std::max_element(row.begin(), row.end()) - row.begin());
      }
    }
  }
  EXPECT_EQ(f.out.get("plain").prompt_logprobs.size(), 0u);
  expect_clean(f);
}

TEST(Engine, ExecutorFailureFailsOnlyThatStepsRequests) {
  Fixture f(config());
  f.engine.submit(greedy("a", make_prompt(6, 1), 5), f.out.callbacks());
  f.model.throw_next = true;
  f.engine.run_until_idle();
  SeqResult a = f.out.get("a");
  EXPECT_EQ(a.finish, FinishReason::kAbort);
  EXPECT_NE(a.error.find("injected device failure"), std::string::npos);
  expect_clean(f);
  f.engine.submit(greedy("b", make_prompt(6, 1), 5), f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("b").tokens, reference_greedy(make_prompt(6, 1), 5, kVocab));
}

// A pipeline of 3 stages: the engine keeps 3 micro-batches of disjoint
// sequences in flight, splits a burst of requests over them, and the tokens
// are those of one batch at a time.
TEST(Engine, PipelinedMicroBatchesMatchReference) {
  Fixture f(config(256, 64), true, 3);
  for (int i = 0; i < 9; ++i) f.engine.submit(greedy("r" + std::to_string(i), make_prompt(5 + i, i), 8), f.out.callbacks());
  f.engine.run_until_idle();
  for (int i = 0; i < 9; ++i)
    EXPECT_EQ(f.out.get("r" + std::to_string(i)).tokens, reference_greedy(make_prompt(5 + i, i), 8, kVocab)) << i;
  // Nine live sequences over three micro-batches: three per batch.
  EXPECT_EQ(*std::max_element(f.model.batch_sizes.begin(), f.model.batch_sizes.end()), 3);
  EXPECT_GT(f.engine.metrics().snapshot().pipeline_overlapped_batches_total, 0);
  expect_clean(f);
}

TEST(Engine, OneBatchInFlightWhenTheConfigSaysSo) {
  EngineConfig c = config(256, 64);
  c.max_batches_in_flight = 1;
  Fixture f(c, true, 3);
  for (int i = 0; i < 4; ++i) f.engine.submit(greedy("r" + std::to_string(i), make_prompt(6, i), 4), f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_EQ(f.engine.metrics().snapshot().pipeline_overlapped_batches_total, 0);
  EXPECT_EQ(f.model.batch_sizes.front(), 4);
  expect_clean(f);
}

TEST(Engine, AbortWhileInFlightKeepsBlocksUntilTheBatchLands) {
  Fixture f(config(256, 64), true, 2);
  for (int i = 0; i < 4; ++i) f.engine.submit(greedy("r" + std::to_string(i), make_prompt(9, i), 30), f.out.callbacks());
  for (int i = 0; i < 3; ++i) f.engine.run_step();
  f.engine.abort("r1");
  f.engine.abort("r2");
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("r1").finish, FinishReason::kAbort);
  EXPECT_EQ(f.out.get("r1").n_final, 1);
  EXPECT_EQ(f.out.get("r0").tokens, reference_greedy(make_prompt(9, 0), 30, kVocab));
  EXPECT_EQ(f.out.get("r3").tokens, reference_greedy(make_prompt(9, 3), 30, kVocab));
  expect_clean(f);  // also: no batch wrote a block another sequence was given
}

TEST(Engine, PipelinedExecutorFailureFailsOnlyThatBatch) {
  Fixture f(config(256, 64), true, 2);
  f.engine.submit(greedy("a", make_prompt(6, 1), 5), f.out.callbacks());
  f.engine.submit(greedy("b", make_prompt(6, 2), 5), f.out.callbacks());
  f.model.throw_next = true;  // the first batch collected: "a"'s
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("a").finish, FinishReason::kAbort);
  EXPECT_EQ(f.out.get("b").tokens, reference_greedy(make_prompt(6, 2), 5, kVocab));
  expect_clean(f);
}

TEST(Engine, ThreadedSubmitAbortAndDrainingStop) {
  Fixture f(config(512, 64));
  f.engine.start();
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        std::string id = "t" + std::to_string(t) + "_" + std::to_string(i);
        f.engine.submit(greedy(id, make_prompt(8 + i, t * 10 + i), 8), f.out.callbacks());
      }
    });
  for (auto& c : clients) c.join();
  // Aborted while the twenty others still run (the queue keeps submit and
  // abort in order): waiting for them first let "long" finish its 400
  // tokens before the abort arrived whenever this thread was descheduled.
  f.engine.submit(greedy("long", make_prompt(8, 999), 400), f.out.callbacks());
  f.engine.abort("long");
  ASSERT_TRUE(f.out.wait_finished(21));
  EXPECT_EQ(f.out.get("long").finish, FinishReason::kAbort);
  for (int t = 0; t < 4; ++t)
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(f.out.get("t" + std::to_string(t) + "_" + std::to_string(i)).tokens,
                reference_greedy(make_prompt(8 + i, t * 10 + i), 8, kVocab));
  f.engine.submit(greedy("last", make_prompt(8, 5), 30), f.out.callbacks());
  f.engine.stop(/*drain=*/true);  // finishes "last" before returning
  EXPECT_EQ(f.out.get("last").finish, FinishReason::kLength);
  EXPECT_THROW(f.engine.submit(greedy("late", {1}, 1), f.out.callbacks()), Error);
  expect_clean(f);
}

TEST(Engine, AbortingStopEndsEverything) {
  Fixture f(config(512, 64));
  f.engine.start();
  for (int i = 0; i < 5; ++i) f.engine.submit(greedy("r" + std::to_string(i), make_prompt(8, i), 400), f.out.callbacks());
  f.engine.stop(/*drain=*/false);
  for (int i = 0; i < 5; ++i) {
    SeqResult r = f.out.get("r" + std::to_string(i));
    EXPECT_EQ(r.n_final, 1);
    EXPECT_EQ(r.finish, FinishReason::kAbort);
  }
  expect_clean(f);
}

// Burst admission (engine/arrivals.h). An engine that wakes idle holds its
// first submission while another request is announced, then prefills both
// in one step.
constexpr double kOneHourMs = 3.6e6;  // a window only the tests' events end

EngineConfig burst_config(double window_ms) {
  EngineConfig c = config();
  c.arrivals = std::make_shared<Arrivals>();
  c.burst_window_ms = window_ms;
  return c;
}

TEST(Engine, BurstAdmissionHoldsASubmissionWhileAnotherIsAnnounced) {
  EngineConfig c = burst_config(kOneHourMs);
  Fixture f(c);
  f.engine.start();
  Arrivals::Ticket second = c.arrivals->announce();
  f.engine.submit(greedy("a", make_prompt(8, 1), 4), f.out.callbacks());
  ASSERT_TRUE(c.arrivals->wait_for_engine_waits(1, std::chrono::seconds(60))) << "the engine did not hold 'a'";
  f.engine.submit(greedy("b", make_prompt(9, 2), 4), f.out.callbacks());
  second.release();
  ASSERT_TRUE(f.out.wait_finished(2));
  f.engine.stop();
  ASSERT_FALSE(f.model.batch_sizes.empty());
  EXPECT_EQ(f.model.batch_sizes[0], 2) << "'a' was prefilled before 'b' arrived";
  EXPECT_EQ(f.out.get("a").tokens, reference_greedy(make_prompt(8, 1), 4, kVocab));
  EXPECT_EQ(f.out.get("b").tokens, reference_greedy(make_prompt(9, 2), 4, kVocab));
  EXPECT_EQ(c.arrivals->n_engine_waits(), 1);
  EXPECT_EQ(f.engine.metrics().snapshot().burst_holds_total, 1);
  EXPECT_GT(f.engine.metrics().snapshot().burst_hold_seconds_total, 0.0);
  expect_clean(f);
}

TEST(Engine, BurstAdmissionHoldsNoLoneRequest) {
  EngineConfig c = burst_config(kOneHourMs);
  Fixture f(c);
  f.engine.start();
  f.engine.submit(greedy("a", make_prompt(8, 1), 4), f.out.callbacks());
  ASSERT_TRUE(f.out.wait_finished(1)) << "a lone request on an idle engine was held";
  EXPECT_EQ(c.arrivals->n_engine_waits(), 0);
  // An announced request that never comes (refused before its submit)
  // releases the one held for it.
  Arrivals::Ticket refused = c.arrivals->announce();
  f.engine.submit(greedy("b", make_prompt(8, 2), 4), f.out.callbacks());
  ASSERT_TRUE(c.arrivals->wait_for_engine_waits(1, std::chrono::seconds(60)));
  refused.release();
  ASSERT_TRUE(f.out.wait_finished(2));
  EXPECT_EQ(f.out.get("b").tokens, reference_greedy(make_prompt(8, 2), 4, kVocab));
}

TEST(Engine, BurstAdmissionWaitsNoLongerThanItsWindowOrAStop) {
  EngineConfig c = burst_config(1);
  Arrivals::Ticket never = c.arrivals->announce();
  {
    Fixture f(c);
    f.engine.start();
    f.engine.submit(greedy("a", make_prompt(8, 1), 4), f.out.callbacks());
    // (An engine thread that wakes after the millisecond goes at once,
    // without holding: how many holds there were depends on the clock.)
    ASSERT_TRUE(f.out.wait_finished(1)) << "the window did not end the hold";
  }
  c.burst_window_ms = kOneHourMs;
  Fixture f(c);
  f.engine.start();
  const int64_t holds_before = c.arrivals->n_engine_waits();
  f.engine.submit(greedy("b", make_prompt(8, 2), 4), f.out.callbacks());
  ASSERT_TRUE(c.arrivals->wait_for_engine_waits(holds_before + 1, std::chrono::seconds(60)));
  f.engine.stop(/*drain=*/true);  // ends the hold and finishes "b"
  EXPECT_EQ(f.out.get("b").finish, FinishReason::kLength);
  c.burst_window_ms = -1;
  EXPECT_THROW(Engine(c, f.model), Error);
}

TEST(Engine, WithoutDetokenizerNoTextAndNoStopStrings) {
  Fixture f(config(), /*detok=*/false);
  EngineRequest r = greedy("a", make_prompt(5, 1), 4);
  r.stop.stop = {"x"};
  EXPECT_THROW(f.engine.submit(r, f.out.callbacks()), Error);
  r.stop.stop.clear();
  f.engine.submit(r, f.out.callbacks());
  f.engine.run_until_idle();
  EXPECT_EQ(f.out.get("a").tokens.size(), 4u);
  EXPECT_TRUE(f.out.get("a").text.empty());
}


namespace grammar_tests {

// Bytes for the 64 fake-model tokens: single characters JSON needs, a few
// multi-byte pieces, filler the grammar never allows, and the EOS id 63.
std::vector<std::string> toy_bytes() {
  std::vector<std::string> t;
  for (char c : std::string("{}\":, 0123456789nokteruflsab[]-.")) t.push_back(std::string(1, c));
  for (const char* s : {"{\"", "\": ", "true", "false", ", \"", "12", "\"n", "ok\"", "}\n"}) t.push_back(s);
  while (t.size() < 63) t.push_back("zz");
  t.push_back("");  // EOS
  return t;
}
constexpr int32_t kToyEos = 63;

std::shared_ptr<const grammar::CompiledGrammar> toy_grammar(const std::string& schema) {
  static grammar::GrammarCompiler compiler(
      std::make_shared<grammar::TokenVocabulary>(toy_bytes(), std::vector<int32_t>{kToyEos}));
  grammar::GrammarSpec spec;
  spec.kind = grammar::GrammarSpec::Kind::kJsonSchema;
  spec.schema = nlohmann::ordered_json::parse(schema);
  return compiler.compile(spec);
}

const char* const kSchema = R"({"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"}},
                                "required":["n","ok"],"additionalProperties":false})";

std::string bytes_of(const std::vector<int32_t>& tokens) {
  static const auto b = toy_bytes();
  std::string s;
  for (int32_t t : tokens) s += b[size_t(t)];
  return s;
}

void expect_valid(const SeqResult& r, const std::string& id) {
  ASSERT_EQ(r.finish, FinishReason::kStop) << id << ": " << bytes_of(r.tokens) << " " << r.error;
  std::vector<int32_t> toks = r.tokens;
  if (!toks.empty() && toks.back() == kToyEos) toks.pop_back();
  const auto v = nlohmann::json::parse(bytes_of(toks));  // throws if not JSON
  EXPECT_TRUE(v.at("n").is_number_integer()) << bytes_of(toks);
  EXPECT_TRUE(v.at("ok").is_boolean()) << bytes_of(toks);
  EXPECT_EQ(v.size(), 2u);
}

TEST(EngineGrammar, SampledAndGreedyOutputsFollowTheSchemaAndStop) {
  EngineConfig c = config();
  c.eos_token_ids = {kToyEos};
  Fixture f(c);
  const auto g = toy_grammar(kSchema);
  for (int i = 0; i < 16; ++i) {  // a batch of 16 constrained sequences: masks filled in parallel
    EngineRequest r = greedy("g" + std::to_string(i), make_prompt(5 + i, 900 + i), 80);
    r.stop.ignore_eos = false;
    r.stop.min_tokens = 3;  // the grammar, not min_tokens, decides the end
    if (i % 2) {
      r.sampling.temperature = 1.0;
      r.sampling.seed = 77 + i;
    }
    r.grammar = g;
    f.engine.submit(r, f.out.callbacks());
  }
  EngineRequest free = greedy("free", make_prompt(9, 5), 20);  // unconstrained in the same batch
  f.engine.submit(free, f.out.callbacks());
  f.engine.run_until_idle();
  for (int i = 0; i < 16; ++i) expect_valid(f.out.get("g" + std::to_string(i)), "g" + std::to_string(i));
  EXPECT_EQ(f.out.get("free").tokens, reference_greedy(make_prompt(9, 5), 20, kVocab));
  expect_clean(f);
}

TEST(EngineGrammar, PreemptionKeepsTheGrammarState) {
  auto run = [](int32_t n_blocks, int64_t* n_preempt) {
    EngineConfig c = config(n_blocks, 64);
    c.eos_token_ids = {kToyEos};
    c.defer_mask_walk_ms = 0;  // new states' masks on the worker: held sequences are preempted too
    Fixture f(c);
    const auto g = toy_grammar(R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":99},"minItems":6,"maxItems":6})");
    for (int i = 0; i < 8; ++i) {
      EngineRequest r = greedy("p" + std::to_string(i), make_prompt(10 + 7 * i, 60 + i), 60);
      r.grammar = g;
      f.engine.submit(r, f.out.callbacks());
    }
    f.engine.run_until_idle();
    std::map<std::string, std::vector<int32_t>> got;
    for (int i = 0; i < 8; ++i) {
      SeqResult r = f.out.get("p" + std::to_string(i));
      EXPECT_EQ(r.finish, FinishReason::kStop) << bytes_of(r.tokens);
      const auto v = nlohmann::json::parse(bytes_of(r.tokens));
      EXPECT_EQ(v.size(), 6u);
      got["p" + std::to_string(i)] = r.tokens;
    }
    *n_preempt = f.engine.metrics().snapshot().num_preemptions_total;
    expect_clean(f);
    return got;
  };
  int64_t n0 = 0, n1 = 0;
  const auto ref = run(512, &n0);
  const auto got = run(30, &n1);
  EXPECT_EQ(n0, 0);
  EXPECT_GT(n1, 0);
  EXPECT_EQ(ref, got);
}

// A new grammar state's mask (a walk over the vocabulary: seconds for a
// large choice grammar) is computed off the engine thread while its
// sequence waits: here the mask worker is held back by the test, and an
// unconstrained request in the same engine still runs to its end. Computed
// in the step, as before, the held mask would stop every request. Once let
// go, the constrained request completes with valid JSON.
TEST(EngineGrammar, ANewStatesMaskDoesNotStallTheOtherRequests) {
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool open = false;
  int n_jobs = 0;
  EngineConfig c = config();
  c.eos_token_ids = {kToyEos};
  c.defer_mask_walk_ms = 0;  // the toy vocabulary's walks take microseconds
  c.before_mask_job = [&] {
    std::unique_lock<std::mutex> lock(gate_mutex);
    ++n_jobs;
    gate_cv.notify_all();
    gate_cv.wait(lock, [&] { return open; });
  };
  Fixture f(c);
  auto open_gate = [&] {
    {
      std::lock_guard<std::mutex> lock(gate_mutex);
      open = true;
    }
    gate_cv.notify_all();
  };
  struct Guard {  // a failed assertion must not leave the worker blocked: the engine's stop joins it
    std::function<void()> fn;
    ~Guard() { fn(); }
  } guard{open_gate};
  // A schema no other test compiles: its states' masks are not cached yet.
  const auto g = toy_grammar(R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"}},
                                 "required":["ok","n"],"additionalProperties":false})");
  f.engine.start();
  EngineRequest constrained = greedy("c", make_prompt(6, 31), 80);
  constrained.stop.ignore_eos = false;
  constrained.grammar = g;
  f.engine.submit(constrained, f.out.callbacks());
  {
    std::unique_lock<std::mutex> lock(gate_mutex);
    ASSERT_TRUE(gate_cv.wait_for(lock, std::chrono::seconds(60), [&] { return n_jobs > 0; }))
        << "no mask was deferred to the worker";
  }
  f.engine.submit(greedy("free", make_prompt(9, 5), 20), f.out.callbacks());
  ASSERT_TRUE(f.out.wait_finished(1, std::chrono::seconds(60))) << "the held mask stalled the other request";
  EXPECT_EQ(f.out.get("free").tokens, reference_greedy(make_prompt(9, 5), 20, kVocab));
  EXPECT_EQ(f.out.get("c").n_final, 0) << "the constrained request ran on without its mask";
  open_gate();
  ASSERT_TRUE(f.out.wait_finished(2, std::chrono::seconds(60)));
  expect_valid(f.out.get("c"), "c");
  EXPECT_GT(f.engine.metrics().snapshot().grammar_masks_deferred_total, 0);
  f.engine.stop();
  expect_clean(f);
}

TEST(EngineGrammar, GrammarWiderThanTheModelIsRefused) {
  Fixture f(config());
  std::vector<std::string> wide(size_t(kVocab) + 1, "a");
  auto g = std::make_shared<grammar::CompiledGrammar>(
      grammar::build_nfa(grammar::GrammarSpec{}),
      std::make_shared<grammar::TokenVocabulary>(wide, std::vector<int32_t>{}), "json_object");
  EngineRequest r = greedy("w", make_prompt(4, 1), 4);
  r.grammar = g;
  EXPECT_THROW(f.engine.submit(r, f.out.callbacks()), Error);
}

}  // namespace grammar_tests

// ---- Speculative decoding (engine/speculation.h) over the auditing fake ----
// The fake's logits depend on the last token only (window 1), so greedy
// output soon cycles and n-gram drafts get accepted: each test asserts that
// some were, so an identity cannot hold vacuously.

EngineConfig speculative_config(bool speculate, int32_t max_decodes = 64) {
  EngineConfig c = config();
  if (speculate) {
    c.speculative.num_speculative_tokens = 4;
    c.speculative.prompt_lookup_min = 1;
    c.speculative.prompt_lookup_max = 3;
  }
  c.speculative_max_decodes = max_decodes;
  return c;
}

struct SpecRun {
  std::map<std::string, SeqResult> out;
  MetricsSnapshot metrics;
  std::string prometheus;
  int64_t n_steps = 0;
};

// Runs the requests together (all submitted before the first step).
SpecRun run_requests(const EngineConfig& c, const std::vector<EngineRequest>& requests) {
  Fixture f(c);
  f.model.window = 1;
  for (const EngineRequest& r : requests) f.engine.submit(r, f.out.callbacks());
  f.engine.run_until_idle();
  expect_clean(f);
  SpecRun run;
  for (const EngineRequest& r : requests)
    for (int i = 0; i < r.n; ++i) run.out[r.request_id + "/" + std::to_string(i)] = f.out.get(r.request_id, i);
  run.metrics = f.engine.metrics().snapshot();
  run.prometheus = f.engine.render_metrics("m");
  run.n_steps = f.model.n_steps;
  return run;
}

void expect_same_outputs(const SpecRun& spec, const SpecRun& plain) {
  ASSERT_EQ(spec.out.size(), plain.out.size());
  for (const auto& [id, p] : plain.out) {
    const SeqResult& s = spec.out.at(id);
    EXPECT_EQ(s.tokens, p.tokens) << id;
    EXPECT_EQ(s.text, p.text) << id;
    EXPECT_EQ(s.finish, p.finish) << id;
    EXPECT_EQ(s.stop_string, p.stop_string) << id;
    EXPECT_EQ(s.stop_token, p.stop_token) << id;
    EXPECT_EQ(s.n_final, 1) << id;
    ASSERT_EQ(s.logprobs.size(), p.logprobs.size()) << id;
    for (size_t i = 0; i < p.logprobs.size(); ++i) {
      EXPECT_EQ(s.logprobs[i].token_id, p.logprobs[i].token_id) << id << " " << i;
      EXPECT_EQ(s.logprobs[i].logprob, p.logprobs[i].logprob) << id << " " << i;
      EXPECT_EQ(s.logprobs[i].rank, p.logprobs[i].rank) << id << " " << i;
      ASSERT_EQ(s.logprobs[i].top.size(), p.logprobs[i].top.size()) << id << " " << i;
      for (size_t t = 0; t < p.logprobs[i].top.size(); ++t)
        EXPECT_EQ(s.logprobs[i].top[t].token, p.logprobs[i].top[t].token) << id << " " << i;
    }
  }
}

TEST(EngineSpeculation, GreedyTokensOfConcurrentRequestsEqualPlainDecoding) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = greedy("r" + std::to_string(i), make_prompt(6 + i, 300 + i), 30 + 3 * i);
    r.n = i == 2 ? 2 : 1;  // n siblings verify with their own samplers
    r.logprobs = i % 2 == 0;
    r.sampling.logprobs = r.logprobs ? 2 : 0;
    reqs.push_back(r);
  }
  const SpecRun plain = run_requests(speculative_config(false), reqs);
  const SpecRun spec = run_requests(speculative_config(true), reqs);
  expect_same_outputs(spec, plain);
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(spec.out.at("r" + std::to_string(i) + "/0").tokens,
              reference_greedy(reqs[size_t(i)].prompt_token_ids, reqs[size_t(i)].stop.max_tokens, kVocab, 1));
  const MetricsSnapshot& m = spec.metrics;
  EXPECT_GT(m.spec_decode_num_drafts_total, 0);
  EXPECT_GT(m.spec_decode_num_accepted_tokens_total, 0) << "no draft accepted: the identity proved nothing";
  EXPECT_LE(m.spec_decode_num_accepted_tokens_total, m.spec_decode_num_draft_tokens_total);
  EXPECT_LT(spec.n_steps, plain.n_steps);  // accepted drafts saved steps
  EXPECT_EQ(m.generation_tokens_total, plain.metrics.generation_tokens_total);
  // /metrics: vLLM's names; the per-position counts add up to the accepted total.
  ASSERT_EQ(m.spec_decode_num_accepted_tokens_per_pos_total.size(), 4u);
  int64_t per_pos_sum = 0;
  for (int64_t n : m.spec_decode_num_accepted_tokens_per_pos_total) per_pos_sum += n;
  EXPECT_EQ(per_pos_sum, m.spec_decode_num_accepted_tokens_total);
  EXPECT_GE(m.spec_decode_num_accepted_tokens_per_pos_total[0], m.spec_decode_num_accepted_tokens_per_pos_total[3]);
  const std::string& text = spec.prometheus;
  EXPECT_NE(text.find("vllm:spec_decode_num_drafts_total{model_name=\"m\"} " +
                      std::to_string(m.spec_decode_num_drafts_total) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} "), std::string::npos);
  EXPECT_NE(text.find("vllm:spec_decode_num_accepted_tokens_total{model_name=\"m\"} " +
                      std::to_string(m.spec_decode_num_accepted_tokens_total) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"3\"} "),
            std::string::npos) << text;
  EXPECT_EQ(plain.prometheus.find("spec_decode"), std::string::npos);  // off: not exported
}

TEST(EngineSpeculation, PrefixCacheNeverServesRejectedDraftKv) {
  // The first request runs with drafts accepted and rejected (window 1);
  // the later ones with logits of their whole context (window 0), read back
  // from the fake's slots: a block registered while holding a rejected
  // draft's token would change their tokens.
  Fixture f(speculative_config(true));
  f.model.window = 1;
  // Every token once followed by what the model does not produce after it:
  // the first drafts (looked up in the prompt) are rejected, later ones
  // (looked up in the output's cycle) accepted.
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 24; ++t) {
    prompt.push_back(t);
    prompt.push_back((reference_greedy({t}, 1, kVocab, 1)[0] + 1) % int32_t(kVocab));
  }
  f.engine.submit(greedy("first", prompt, 60), f.out.callbacks());
  f.engine.run_until_idle();
  const std::vector<int32_t> first = f.out.get("first").tokens;
  ASSERT_EQ(first, reference_greedy(prompt, 60, kVocab, 1));
  const MetricsSnapshot m = f.engine.metrics().snapshot();
  ASSERT_GT(m.spec_decode_num_accepted_tokens_total, 0);
  ASSERT_GT(m.spec_decode_num_draft_tokens_total, m.spec_decode_num_accepted_tokens_total)
      << "no draft was rejected: nothing to roll back";
  f.model.window = 0;
  for (int cut : {5, 13, 30, 45, 59}) {  // prompts ending inside blocks that held drafts
    std::vector<int32_t> again = prompt;
    again.insert(again.end(), first.begin(), first.begin() + cut);
    const std::string id = "again" + std::to_string(cut);
    f.engine.submit(greedy(id, again, 6), f.out.callbacks());
    f.engine.run_until_idle();
    EXPECT_EQ(f.out.get(id).tokens, reference_greedy(again, 6, kVocab)) << cut;
    EXPECT_GT(f.out.get(id).last.n_cached_tokens, 0) << cut;
  }
  expect_clean(f);
}

TEST(EngineSpeculation, StopStringsEosAndMaxTokensEndExactlyAsWithout) {
  const std::vector<int32_t> prompt = make_prompt(8, 91);
  const std::vector<int32_t> ref = reference_greedy(prompt, 48, kVocab, 1);
  const std::string full = toy_text(ref);
  std::vector<EngineRequest> reqs;
  for (int32_t m : {1, 2, 3, 5, 8, 13, 21}) reqs.push_back(greedy("len" + std::to_string(m), prompt, m));
  for (size_t at : {size_t(9), size_t(20), size_t(33)}) {  // stop strings drafted through, at several offsets
    for (bool include : {false, true}) {
      EngineRequest r = greedy("stop" + std::to_string(at) + (include ? "i" : ""), prompt, 48);
      r.stop.stop = {full.substr(at, 2)};
      r.stop.include_stop_str_in_output = include;
      reqs.push_back(r);
    }
  }
  EngineRequest eos = greedy("eos", prompt, 48);
  eos.stop.ignore_eos = false;
  eos.stop.stop_token_ids = {ref[26]};  // a stop token the drafts carry past
  eos.stop.min_tokens = 4;              // rows below it ban the stop token
  reqs.push_back(eos);
  const SpecRun plain = run_requests(speculative_config(false), reqs);
  const SpecRun spec = run_requests(speculative_config(true), reqs);
  expect_same_outputs(spec, plain);
  for (int32_t m : {1, 2, 3, 5, 8, 13, 21}) {
    const SeqResult& s = spec.out.at("len" + std::to_string(m) + "/0");
    EXPECT_EQ(s.tokens.size(), size_t(m));
    EXPECT_EQ(s.finish, FinishReason::kLength);
  }
  EXPECT_EQ(spec.out.at("stop20/0").finish, FinishReason::kStop);
  EXPECT_EQ(spec.out.at("eos/0").finish, FinishReason::kStop);
  EXPECT_GT(spec.metrics.spec_decode_num_accepted_tokens_total, 0);
}

// Below min_tokens each verified row bans the stop tokens for the output
// position it produces. The stop token recurs in the greedy cycle, so the
// drafts (looked up in the context) propose it; the row that would produce
// it must ban it as a plain step does, and the output diverge from the
// reference in the same way with speculation on or off. The whole request
// lies below min_tokens, so every draft was made there.
TEST(EngineSpeculation, DraftsBelowMinTokensBanTheStopTokensRowByRow) {
  const std::vector<int32_t> prompt = make_prompt(8, 91);
  const std::vector<int32_t> ref = reference_greedy(prompt, 48, kVocab, 1);
  std::vector<EngineRequest> reqs;
  for (size_t at : {size_t(3), size_t(12), size_t(26)}) {
    EngineRequest r = greedy("min" + std::to_string(at), prompt, 40);
    r.stop.ignore_eos = false;
    r.stop.stop_token_ids = {ref[at]};
    r.stop.min_tokens = 40;
    reqs.push_back(r);
  }
  const SpecRun plain = run_requests(speculative_config(false), reqs);
  const SpecRun spec = run_requests(speculative_config(true), reqs);
  expect_same_outputs(spec, plain);
  for (size_t at : {size_t(3), size_t(12), size_t(26)}) {
    const SeqResult& s = spec.out.at("min" + std::to_string(at) + "/0");
    ASSERT_EQ(s.tokens.size(), size_t(40));
    for (int32_t t : s.tokens) EXPECT_NE(t, ref[at]) << "a banned stop token was produced below min_tokens";
  }
  EXPECT_GT(spec.metrics.spec_decode_num_accepted_tokens_total, 0);
  EXPECT_GT(spec.metrics.spec_decode_num_draft_tokens_total, spec.metrics.spec_decode_num_accepted_tokens_total)
      << "no draft was rejected: no row's ban was tested";
}

// Structured output: the drafts are cut to what the grammar accepts and each
// verified row is masked with its own grammar state, so the constrained
// outputs (greedy and seeded) are those without speculation, valid, and
// drafts were accepted under the grammar.
TEST(EngineSpeculation, GrammarConstrainedRowsAreMaskedRowByRow) {
  using grammar_tests::bytes_of;
  using grammar_tests::kToyEos;
  using grammar_tests::toy_grammar;
  std::vector<EngineRequest> reqs;
  const auto g = toy_grammar(
      R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"minItems":12,"maxItems":16})");
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = greedy("g" + std::to_string(i), make_prompt(6 + i, 700 + i), 60);
    r.stop.ignore_eos = false;
    if (i % 2) {
      r.sampling.temperature = 0.8;
      r.sampling.seed = 90 + i;
    }
    r.grammar = g;
    reqs.push_back(r);
  }
  EngineConfig plain_config = speculative_config(false), spec_config = speculative_config(true);
  plain_config.eos_token_ids = spec_config.eos_token_ids = {kToyEos};
  const SpecRun plain = run_requests(plain_config, reqs);
  const SpecRun spec = run_requests(spec_config, reqs);
  expect_same_outputs(spec, plain);
  for (int i = 0; i < 4; ++i) {
    const SeqResult& s = spec.out.at("g" + std::to_string(i) + "/0");
    std::vector<int32_t> toks = s.tokens;
    if (!toks.empty() && toks.back() == kToyEos) toks.pop_back();
    if (s.finish == FinishReason::kStop) {
      EXPECT_TRUE(nlohmann::json::parse(bytes_of(toks)).is_array()) << bytes_of(toks);
    }
  }
  EXPECT_GT(spec.metrics.spec_decode_num_accepted_tokens_total, 0) << "no draft was accepted under the grammar";
}

TEST(EngineSpeculation, SeededSamplingDrawsTheSameTokensWithOrWithout) {
  // Verification samples each row with the sequence's own RNG, one draw per
  // produced token, as plain decoding does: seeded outputs are identical.
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = greedy("t" + std::to_string(i), make_prompt(6, 500 + i), 50);
    r.sampling.temperature = 0.5 + 0.2 * i;
    r.sampling.top_k = i == 1 ? 6 : -1;
    r.sampling.top_p = i == 2 ? 0.9 : 1.0;
    r.sampling.frequency_penalty = i == 3 ? 0.3 : 0.0;
    r.sampling.seed = 40 + i;
    r.logprobs = true;
    reqs.push_back(r);
  }
  const SpecRun plain = run_requests(speculative_config(false), reqs);
  const SpecRun spec = run_requests(speculative_config(true), reqs);
  expect_same_outputs(spec, plain);
  EXPECT_GT(spec.metrics.spec_decode_num_accepted_tokens_total, 0);
}

TEST(EngineSpeculation, NoDraftsWhileTheStepHoldsMoreDecodesThanTheBound) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(greedy("b" + std::to_string(i), make_prompt(6, 600 + i), 24));
  const SpecRun off = run_requests(speculative_config(true, /*max_decodes=*/3), reqs);
  EXPECT_EQ(off.metrics.spec_decode_num_drafts_total, 0);
  const SpecRun on = run_requests(speculative_config(true, /*max_decodes=*/4), reqs);
  EXPECT_GT(on.metrics.spec_decode_num_drafts_total, 0);
  expect_same_outputs(on, off);
}

}  // namespace
}  // namespace shardlm
