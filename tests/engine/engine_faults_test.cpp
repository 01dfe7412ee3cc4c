// Failures inside an engine step leave the block pool consistent: a sampler
// or detokenizer that throws ends only the requests it touched, and an
// executor whose rank group broke fails everything in flight, turns the
// engine unhealthy (new requests refused, naming the error), is restarted in
// place, and serves the reference tokens again.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "fake_model.h"

namespace shardlm {
namespace {

using testing::FakeModel;
using testing::reference_greedy;
using testing::ToyDetokenizer;

constexpr int64_t kVocab = 64;

struct Result {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  bool done = false;
};

class Outputs {
 public:
  RequestCallbacks callbacks() {
    return {[this](const SequenceOutput& o) {
      std::lock_guard<std::mutex> lock(mutex_);
      Result& r = results_[o.request_id];
      r.tokens.insert(r.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished()) {
        r.finish = o.finish_reason;
        r.error = o.error;
      }
      if (o.request_finished) {
        r.done = true;
        cv_.notify_all();
      }
    }};
  }
  Result get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return results_[id];
  }
  bool wait(const std::vector<std::string>& ids, std::chrono::seconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] {
      for (const auto& id : ids)
        if (!results_[id].done) return false;
      return true;
    });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, Result> results_;
};

EngineConfig config() {
  EngineConfig c;
  c.scheduler.n_blocks = 128;
  c.scheduler.block_size = 4;
  c.scheduler.max_num_seqs = 16;
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.max_model_len = 256;
  return c;
}

std::vector<int32_t> prompt(int32_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p(n);
  for (auto& t : p) t = int32_t(rng() % kVocab);
  return p;
}

EngineRequest greedy(const std::string& id, std::vector<int32_t> p, int32_t max_tokens) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(p);
  r.sampling.temperature = 0.0f;
  r.stop.max_tokens = max_tokens;
  r.stop.ignore_eos = true;
  return r;
}

// A sampler that throws at its `throw_at`-th call (1-based).
class ThrowingSampler : public Sampler {
 public:
  ThrowingSampler(const SamplingParams& p, std::span<const int32_t> prompt, int64_t vocab, int throw_at)
      : Sampler(p, prompt, vocab), throw_at_(throw_at) {}
  SampleResult sample(std::span<const float> logits) override {
    if (++n_calls_ == throw_at_) throw std::runtime_error("sampler test double: injected failure");
    return Sampler::sample(logits);
  }

 private:
  int throw_at_;
  int n_calls_ = 0;
};

// Throws from push() for prompts that start with token 63.
class ThrowingDetokenizer : public Detokenizer {
  class Stream : public DetokenizerStream {
   public:
    explicit Stream(bool poisoned) : poisoned_(poisoned) {}
    std::string push(int32_t) override {
      if (poisoned_ && ++n_ == 3) throw std::runtime_error("detokenizer test double: injected failure");
      return "x";
    }
    std::string flush() override { return ""; }

   private:
    bool poisoned_;
    int n_ = 0;
  };

 public:
  std::unique_ptr<DetokenizerStream> stream(std::span<const int32_t> p, bool) const override {
    return std::make_unique<Stream>(!p.empty() && p[0] == 63);
  }
};

// Serial and parallel sampling (EngineConfig::parallel_sampling_min_work 0:
// the rows of a step sampled by an OpenMP team, the error rethrown after it).
class SamplerFaults : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(EngineFaults, SamplerFaults, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "parallel" : "serial"; });

TEST_P(SamplerFaults, SamplerThrowingBetweenCollectAndCommitReturnsEveryBlock) {
  EngineConfig c = config();
  if (GetParam()) c.parallel_sampling_min_work = 0;
  // The request whose prompt starts with 63 gets a sampler that fails at its 3rd token.
  c.make_sampler = [](const SamplingParams& p, std::span<const int32_t> ids, int64_t vocab) -> std::unique_ptr<Sampler> {
    if (!ids.empty() && ids[0] == 63) return std::make_unique<ThrowingSampler>(p, ids, vocab, 3);
    return std::make_unique<Sampler>(p, ids, vocab);
  };
  FakeModel model(kVocab, c.scheduler.n_blocks, c.scheduler.block_size);
  Outputs out;
  Engine engine(c, model);
  std::vector<int32_t> bad = prompt(9, 1);
  bad[0] = 63;
  engine.submit(greedy("bad", bad, 10), out.callbacks());
  if (GetParam()) engine.submit(greedy("also", prompt(8, 9), 10), out.callbacks());  // a second row in the team
  engine.run_until_idle();
  EXPECT_EQ(out.get("bad").finish, FinishReason::kAbort);
  EXPECT_NE(out.get("bad").error.find("sampler test double"), std::string::npos) << out.get("bad").error;
  EXPECT_EQ(out.get("bad").tokens.size(), 2u);
  EXPECT_EQ(engine.scheduler().pool().n_used(), 0);  // before the fix: the in-flight plan's blocks stayed taken
  EXPECT_DOUBLE_EQ(engine.metrics().snapshot().kv_cache_usage_perc, 0.0);
  // The engine serves on, with the right tokens.
  engine.submit(greedy("good", prompt(7, 2), 6), out.callbacks());
  engine.run_until_idle();
  EXPECT_EQ(out.get("good").tokens, reference_greedy(prompt(7, 2), 6, kVocab));
  EXPECT_EQ(engine.scheduler().pool().n_used(), 0);
  EXPECT_TRUE(model.errors.empty()) << model.errors.front();
}

TEST(EngineFaults, DetokenizerThrowingEndsOnlyThatRequest) {
  EngineConfig c = config();
  FakeModel model(kVocab, c.scheduler.n_blocks, c.scheduler.block_size);
  ThrowingDetokenizer detok;
  Outputs out;
  Engine engine(c, model, &detok);
  std::vector<int32_t> bad = prompt(9, 3);
  bad[0] = 63;
  engine.submit(greedy("bad", bad, 10), out.callbacks());
  engine.submit(greedy("good", prompt(8, 4), 10), out.callbacks());  // batched with "bad"
  engine.run_until_idle();
  EXPECT_EQ(out.get("bad").finish, FinishReason::kAbort);
  EXPECT_NE(out.get("bad").error.find("detokenizer test double"), std::string::npos) << out.get("bad").error;
  EXPECT_EQ(out.get("good").finish, FinishReason::kLength);
  EXPECT_EQ(out.get("good").tokens, reference_greedy(prompt(8, 4), 10, kVocab));
  EXPECT_EQ(engine.scheduler().pool().n_used(), 0);
  EXPECT_TRUE(model.errors.empty()) << model.errors.front();
}

// A model whose "rank group" breaks: after the failure it stays broken
// (every batch throws) until restart(), which the test may hold up.
class BreakableModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  void execute(const ForwardBatch& batch, float* logits) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (break_at_step > 0 && ++n_batches_ == break_at_step) broken_ = true;
      if (broken_) throw Error(ErrorCode::kDistributed, "rank 1 (tp 1, pp 0) failed: injected");
    }
    FakeModel::execute(batch, logits);
  }
  bool healthy() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return !broken_;
  }
  bool restart() override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++n_restarts;
    restarting_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_restart; });
    restarting_ = false;
    if (!can_restart) return false;
    broken_ = false;
    drop_pending();  // the batch still queued in the default pipeline never runs
    n_batches_ = 0;
    break_at_step = -1;
    return true;
  }
  void wait_restarting() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return restarting_; });
  }
  void release_restart() {
    std::lock_guard<std::mutex> lock(mutex_);
    hold_restart = false;
    cv_.notify_all();
  }

  int break_at_step = -1;
  bool hold_restart = false;
  bool can_restart = true;
  int n_restarts = 0;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int n_batches_ = 0;
  bool broken_ = false;
  bool restarting_ = false;
};

TEST(EngineFaults, BrokenExecutorFailsEverythingTurnsUnhealthyRestartsAndServesAgain) {
  EngineConfig c = config();
  BreakableModel model(kVocab, c.scheduler.n_blocks, c.scheduler.block_size);
  model.depth = 2;  // two batches in flight when it breaks
  model.break_at_step = 4;
  model.hold_restart = true;
  Outputs out;
  Engine engine(c, model);
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back("r" + std::to_string(i));
    engine.submit(greedy(ids.back(), prompt(6 + i, 10 + i), 40), out.callbacks());
  }
  engine.start();
  model.wait_restarting();
  // Every request ended with the rank's error, and the engine says it is down.
  ASSERT_TRUE(out.wait(ids));
  for (const auto& id : ids) {
    EXPECT_EQ(out.get(id).finish, FinishReason::kAbort) << id;
    EXPECT_NE(out.get(id).error.find("rank 1 (tp 1, pp 0) failed: injected"), std::string::npos) << out.get(id).error;
  }
  EngineHealth h = engine.health();
  EXPECT_FALSE(h.ok);
  EXPECT_FALSE(h.fatal);
  EXPECT_NE(h.error.find("rank 1"), std::string::npos) << h.error;
  try {
    engine.submit(greedy("during", prompt(5, 1), 4), out.callbacks());
    ADD_FAILURE() << "submit while the executor restarts must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDistributed);
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(engine.metrics().snapshot().kv_cache_usage_perc, 0.0);  // every block returned
  // /metrics while it restarts: down, one failure naming the rank, no restart yet.
  std::string text = engine.render_metrics("m");
  EXPECT_NE(text.find("shardlm:executor_up{model_name=\"m\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("shardlm:executor_failures_total{model_name=\"m\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("shardlm:executor_restarts_total{model_name=\"m\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("shardlm:executor_last_failure_info{model_name=\"m\",reason=\"rank 1 (tp 1, pp 0) failed: "
                      "injected\"} 1\n"),
            std::string::npos)
      << text;
  model.release_restart();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!engine.health().ok && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  h = engine.health();
  ASSERT_TRUE(h.ok) << h.error;
  EXPECT_EQ(h.n_failures, 1);
  EXPECT_EQ(h.n_restarts, 1);
  EXPECT_GT(h.last_recovery_s, 0.0);
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_EQ(m.executor_restarts_total, 1);
  EXPECT_EQ(m.executor_failures_total, 1);
  EXPECT_TRUE(m.executor_up);
  EXPECT_DOUBLE_EQ(m.executor_last_recovery_seconds, h.last_recovery_s);
  text = engine.render_metrics("m");
  EXPECT_NE(text.find("shardlm:executor_restarts_total{model_name=\"m\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("shardlm:executor_up{model_name=\"m\"} 1\n"), std::string::npos) << text;
  engine.submit(greedy("after", prompt(7, 5), 8), out.callbacks());
  ASSERT_TRUE(out.wait({"after"}));
  EXPECT_EQ(out.get("after").tokens, reference_greedy(prompt(7, 5), 8, kVocab));
  engine.stop(true);
  EXPECT_EQ(engine.scheduler().pool().n_used(), 0);
  EXPECT_TRUE(model.errors.empty()) << model.errors.front();
}

TEST(EngineFaults, AnExecutorThatCannotRestartLeavesTheEngineDownForGood) {
  EngineConfig c = config();
  BreakableModel model(kVocab, c.scheduler.n_blocks, c.scheduler.block_size);
  model.break_at_step = 2;
  model.can_restart = false;  // ranks in other processes
  Outputs out;
  Engine engine(c, model);
  engine.submit(greedy("a", prompt(6, 1), 10), out.callbacks());
  engine.run_until_idle();
  EXPECT_EQ(out.get("a").finish, FinishReason::kAbort);
  EngineHealth h = engine.health();
  EXPECT_FALSE(h.ok);
  EXPECT_TRUE(h.fatal);
  EXPECT_NE(h.error.find("rank 1 (tp 1, pp 0) failed"), std::string::npos) << h.error;
  EXPECT_NE(h.error.find("cannot be restarted"), std::string::npos) << h.error;
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_EQ(m.executor_failures_total, 1);
  EXPECT_EQ(m.executor_restarts_total, 0);
  EXPECT_FALSE(m.executor_up);
  EXPECT_THROW(engine.submit(greedy("b", prompt(6, 2), 4), out.callbacks()), Error);
  EXPECT_EQ(engine.scheduler().pool().n_used(), 0);
}

TEST(EngineFaults, RestartsStopAtTheLimit) {
  EngineConfig c = config();
  c.max_executor_restarts = 0;
  BreakableModel model(kVocab, c.scheduler.n_blocks, c.scheduler.block_size);
  model.break_at_step = 1;
  Outputs out;
  Engine engine(c, model);
  engine.submit(greedy("a", prompt(6, 1), 10), out.callbacks());
  engine.run_until_idle();
  EngineHealth h = engine.health();
  EXPECT_TRUE(h.fatal);
  EXPECT_EQ(model.n_restarts, 0);
  EXPECT_NE(h.error.find("max_executor_restarts"), std::string::npos) << h.error;
  EXPECT_EQ(engine.scheduler().pool().n_used(), 0);
}

}  // namespace
}  // namespace shardlm
