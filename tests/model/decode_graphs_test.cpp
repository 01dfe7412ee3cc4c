// Decode steps through graphs, end to end on the CPU: CausalLM on a backend
// that delegates every op to the CPU backend and hands out a fake graph
// runner (capture records the step without running it; replay runs it), so
// the padded graph path (metadata padded to the bucket, buffers allocated at
// the largest bucket, logits of the real rows only) is checked against the
// eager path here, where no GPU is. The CUDA runner itself is in
// backend/cuda/cuda_graph.cpp and runs in scripts/gpu-check.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "comm/local_comm.h"
#include "core/error.h"
#include "model/causal_lm.h"
#include "random_weights.h"

namespace shardlm {
namespace {

using backend::Backend;

struct FakeGraphs {
  int fail_capture_of = -1;
  int n_captures = 0, n_replays = 0, n_clears = 0;
  uint64_t epoch = 0;
  int n_device_samples = 0;
};

class FakeRunner final : public backend::GraphStepRunner {
 public:
  FakeRunner(FakeGraphs* s, std::function<void(int)> step) : s_(s), step_(std::move(step)) {}
  void run_eager(int n) override {
    if (!capturing_) step_(n);  // while capturing: recorded, not run
  }
  void begin_capture(int) override { capturing_ = true; }
  void end_capture(int b) override {
    capturing_ = false;
    if (b == s_->fail_capture_of) throw std::runtime_error("fake capture failure");
    ++s_->n_captures;
  }
  void abandon_capture(int) noexcept override { capturing_ = false; }
  void replay(int b) override {
    ++s_->n_replays;
    step_(b);
  }
  void clear() noexcept override { ++s_->n_clears; }

 private:
  FakeGraphs* s_;
  std::function<void(int)> step_;
  bool capturing_ = false;
};

// Every op goes to the CPU backend; graphs come from FakeRunner.
class GraphCpuBackend final : public Backend {
 public:
  explicit GraphCpuBackend(FakeGraphs* s) : s_(s), cpu_(backend::make_backend({})) {}
  Device device() const override { return cpu_->device(); }
  std::string name() const override { return "cpu with fake graphs"; }
  DType activation_dtype() const override { return cpu_->activation_dtype(); }
  Tensor alloc(DType d, TensorShape s) override { return cpu_->alloc(d, s); }
  int64_t allocated_bytes() const override { return cpu_->allocated_bytes(); }
  Tensor adopt_weight(Tensor host) override { return cpu_->adopt_weight(std::move(host)); }
  void upload(const void* h, Tensor& d) override { cpu_->upload(h, d); }
  void download(const Tensor& s, void* h) override { cpu_->download(s, h); }
  void synchronize() override { cpu_->synchronize(); }
  void begin_step(const backend::StepMetadata& m) override { cpu_->begin_step(m); }
  void do_embed(const Tensor& t, int64_t b, int64_t e, int64_t v, const backend::StepMetadata& m, Tensor& o) override {
    cpu_->embed(t, b, e, v, m, o);
  }
  void do_matmul(const Tensor& x, const backend::Linear& w, Tensor& y) override { cpu_->matmul(x, w, y); }
  void do_rms_norm(const Tensor& x, const backend::NormWeight& w, float eps, Tensor& o) override { cpu_->rms_norm(x, w, eps, o); }
  void do_add_rms_norm(Tensor& h, const Tensor& d, const backend::NormWeight& w, float eps, Tensor& o) override {
    cpu_->add_rms_norm(h, d, w, eps, o);
  }
  void do_add(Tensor& y, const Tensor& x) override { cpu_->add(y, x); }
  void do_scale(Tensor& x, float s) override { cpu_->scale(x, s); }
  void do_rope(Tensor& x, const Tensor& f, const backend::StepMetadata& m, float s) override { cpu_->rope(x, f, m, s); }
  void do_silu_mul(const Tensor& g, const Tensor& u, Tensor& o) override { cpu_->silu_mul(g, u, o); }
  void do_gelu_tanh_mul(const Tensor& g, const Tensor& u, Tensor& o) override { cpu_->gelu_tanh_mul(g, u, o); }
  void do_kv_cache_write(const backend::KvLayerView& c, const backend::StepMetadata& m, const Tensor& k,
                      const Tensor& v) override {
    cpu_->kv_cache_write(c, m, k, v);
  }
  void do_paged_attention(const Tensor& q, const backend::KvLayerView& c, const backend::StepMetadata& m,
                       const backend::AttentionHeads& h, Tensor& o) override {
    cpu_->paged_attention(q, c, m, h, o);
  }
  void do_gather_logit_rows(const Tensor& x, const backend::StepMetadata& m, Tensor& o) override {
    cpu_->gather_logit_rows(x, m, o);
  }
  std::unique_ptr<backend::GraphStepRunner> make_graph_runner(std::function<void(int)> step) override {
    return std::make_unique<FakeRunner>(s_, std::move(step));
  }
  uint64_t buffer_epoch() const override { return s_->epoch; }
  // A "device" sampler over the host logits: greedy rows only (what the test asks of it).
  std::string unsupported(const backend::OpArgs& args) const override {
    return args.op == backend::Op::kSampleRows ? std::string() : cpu_->unsupported(args);
  }
  void do_sample_rows(const Tensor& logits, std::span<const backend::DeviceSampleRow> rows, int32_t* ids,
                   float* logprobs) override {
    const int64_t vocab = logits.dim(1);
    for (size_t r = 0; r < rows.size(); ++r) {
      SHARDLM_CHECK(rows[r].temperature == 0.0f, "the fake device sampler is greedy only");
      const float* x = static_cast<const float*>(logits.data()) + static_cast<int64_t>(r) * vocab;
      int64_t best = 0;
      for (int64_t i = 1; i < vocab; ++i)
        if (x[i] > x[best]) best = i;
      ids[r] = static_cast<int32_t>(best);
      if (logprobs) logprobs[r] = 0.0f;
    }
    ++s_->n_device_samples;
  }

 private:
  FakeGraphs* s_;
  std::shared_ptr<Backend> cpu_;
};

int32_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return static_cast<int32_t>(best);
}

// Three prompts prefilled one by one, then n_steps greedy decode steps of all
// three in one batch (then of the first two: another bucket), on `model`.
// Returns every decode step's logits.
std::vector<std::vector<float>> decode_three(CausalLM& model, int n_steps, int64_t extra_prefill_at = -1) {
  const int64_t vocab = model.spec().vocab_size;
  KvCache cache = model.make_kv_cache(48, 4, DType::kF32);
  const std::vector<std::vector<int32_t>> prompts{{5, 17, 101}, {3, 150, 77, 9, 1}, {42}};
  std::vector<int32_t> n_past(3), next(3);
  auto table = [](int s) {
    std::vector<int32_t> t;
    for (int b = 0; b < 12; ++b) t.push_back(s * 12 + b);
    return t;
  };
  std::vector<float> logits(3 * vocab);
  for (int s = 0; s < 3; ++s) {
    ForwardBatch b;
    b.token_ids = prompts[s];
    b.seqs.push_back({static_cast<int32_t>(prompts[s].size()), 0, table(s), true});
    model.forward(b, cache, logits.data());
    n_past[s] = static_cast<int32_t>(prompts[s].size());
    next[s] = argmax(logits.data(), vocab);
  }
  std::vector<std::vector<float>> out;
  for (int step = 0; step < n_steps; ++step) {
    if (step == extra_prefill_at) {
      // A 40-token prefill of a fourth sequence: more rows than the graphs' buffers.
      ForwardBatch b;
      b.token_ids.assign(40, 7);
      b.seqs.push_back({40, 0, table(3), true});
      model.forward(b, cache, logits.data());
    }
    const int n = step < n_steps - 2 ? 3 : 2;
    ForwardBatch b;
    for (int s = 0; s < n; ++s) {
      b.token_ids.push_back(next[s]);
      b.seqs.push_back({1, n_past[s], table(s), true});
    }
    model.forward(b, cache, logits.data());
    out.emplace_back(logits.begin(), logits.begin() + n * vocab);
    for (int s = 0; s < n; ++s) {
      ++n_past[s];
      next[s] = argmax(logits.data() + s * vocab, vocab);
    }
  }
  return out;
}

double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0.0, scale = 1e-6;
  for (size_t s = 0; s < a.size(); ++s)
    for (size_t i = 0; i < a[s].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(a[s][i] - b[s][i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[s][i])));
    }
  return worst / scale;
}

struct Fixture {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 128, 200);
  std::shared_ptr<MemoryWeightSource> w = testing::random_weights(spec, 11);
  SoloComm tp, pp;
  FakeGraphs fake;
  std::unique_ptr<CausalLM> eager = CausalLM::load(spec, w, Layout{}, 0, 0, tp, pp, backend::make_backend({}));
  std::unique_ptr<CausalLM> graphed =
      CausalLM::load(spec, w, Layout{}, 0, 0, tp, pp, std::make_shared<GraphCpuBackend>(&fake));
};

TEST(CausalLMGraphs, PaddedGraphStepsGiveTheEagerLogits) {
  Fixture f;
  const std::string line = f.graphed->enable_decode_graphs({true, 8, 64});
  EXPECT_NE(line.find("CUDA graphs: on: decode batches 1 to 8 in 4 buckets"), std::string::npos) << line;
  const auto want = decode_three(*f.eager, 7);
  const auto got = decode_three(*f.graphed, 7);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_rel_diff(got, want), 1e-5);
  for (size_t s = 0; s < got.size(); ++s)
    for (size_t r = 0; r < got[s].size() / 200; ++r)
      EXPECT_EQ(argmax(got[s].data() + r * 200, 200), argmax(want[s].data() + r * 200, 200)) << s << " " << r;
  // Batch 3 (bucket 4): warm-up, capture, 3 replays; batch 2 (bucket 2):
  // warm-up, capture; and the third prompt, one token, is a step of one
  // token with logits: bucket 1's warm-up.
  const backend::DecodeGraphs* g = f.graphed->decode_graphs();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(f.fake.n_captures, 2);
  EXPECT_EQ(g->cache().n_replays(), 5);   // 4 for bucket 4 (its capture step included), 1 for bucket 2
  EXPECT_EQ(g->cache().n_eager(), 3);
  EXPECT_EQ(g->n_invalidations(), 0);
}

TEST(CausalLMGraphs, AFailedCaptureFallsBackToEagerWithOneLine) {
  Fixture f;
  f.fake.fail_capture_of = 4;
  std::vector<std::string> log;
  f.graphed->enable_decode_graphs({true, 8, 64}, [&](const std::string& l) { log.push_back(l); });
  const auto want = decode_three(*f.eager, 7);
  const auto got = decode_three(*f.graphed, 7);
  EXPECT_LT(max_rel_diff(got, want), 1e-5);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("batch 4 failed (fake capture failure)"), std::string::npos) << log[0];
  EXPECT_EQ(f.graphed->decode_graphs()->cache().state(4), backend::GraphState::kFailed);
  EXPECT_EQ(f.fake.n_captures, 1);  // bucket 2 still captured
}

TEST(CausalLMGraphs, AMovedBufferInvalidatesAndRecaptures) {
  Fixture f;
  f.graphed->enable_decode_graphs({true, 8, 64});
  // A 40-token prefill in the middle regrows the activations past the 8 rows
  // reserved for the graphs: the graphs go, and are captured again.
  const auto want = decode_three(*f.eager, 7, /*extra_prefill_at=*/3);
  const auto got = decode_three(*f.graphed, 7, 3);
  EXPECT_LT(max_rel_diff(got, want), 1e-5);
  EXPECT_EQ(f.graphed->decode_graphs()->n_invalidations(), 1);
  EXPECT_EQ(f.fake.n_clears, 1);
  EXPECT_EQ(f.fake.n_captures, 3);  // bucket 4 twice, bucket 2 once
}

TEST(CausalLMGraphs, OffWhereGraphsCannotWork) {
  Fixture f;
  // The CPU backend has no graph runner.
  EXPECT_NE(f.eager->enable_decode_graphs({true, 8, 64}).find("off (cpu"), std::string::npos);
  EXPECT_EQ(f.eager->decode_graphs(), nullptr);
  EXPECT_EQ(f.graphed->enable_decode_graphs({false, 8, 64}), "CUDA graphs: off");
  EXPECT_THROW(f.graphed->enable_decode_graphs({true, 8, 0}), Error);
  // TP > 1: the collectives between ranks are not captured.
  Layout tp2;
  tp2.tp = 2;
  auto world = LocalComm::create_world(2);
  std::vector<std::string> lines(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      RankComms c = split_rank_comms(*world[r], tp2);
      auto m = CausalLM::load(f.spec, f.w, tp2, r, 0, *c.tp, *c.pp, std::make_shared<GraphCpuBackend>(&f.fake));
      lines[r] = m->enable_decode_graphs({true, 8, 64});
    });
  for (auto& t : ts) t.join();
  EXPECT_NE(lines[0].find("off (layout"), std::string::npos) << lines[0];
  // Bad token ids are still refused on the graph path (a replay runs no op's checks).
  f.graphed->enable_decode_graphs({true, 8, 64});
  KvCache cache = f.graphed->make_kv_cache(8, 4, DType::kF32);
  ForwardBatch b;
  b.token_ids = {5000};
  b.seqs.push_back({1, 0, {0}, true});
  std::vector<float> logits(200);
  EXPECT_THROW(f.graphed->forward(b, cache, logits.data()), Error);
}

TEST(CausalLMDeviceSampling, OnlyTheIdsComeBackAndTheyAreTheHostsGreedyTokens) {
  Fixture f;
  f.graphed->enable_decode_graphs({true, 8, 64});
  const auto want = decode_three(*f.eager, 4);  // host argmax of host logits
  // The same three sequences, sampled where the logits are (and through the graphs at decode).
  const int64_t vocab = f.spec.vocab_size;
  KvCache cache = f.graphed->make_kv_cache(48, 4, DType::kF32);
  const std::vector<std::vector<int32_t>> prompts{{5, 17, 101}, {3, 150, 77, 9, 1}, {42}};
  std::vector<int32_t> n_past(3), next(3);
  auto table = [](int s) {
    std::vector<int32_t> t;
    for (int b = 0; b < 12; ++b) t.push_back(s * 12 + b);
    return t;
  };
  backend::DeviceSampleRow greedy;
  greedy.temperature = 0.0f;
  const std::vector<backend::DeviceSampleRow> rows(3, greedy);
  for (int s = 0; s < 3; ++s) {
    ForwardBatch b;
    b.token_ids = prompts[s];
    b.seqs.push_back({static_cast<int32_t>(prompts[s].size()), 0, table(s), true});
    f.graphed->forward_sampled(b, cache, {rows.data(), 1}, &next[s], nullptr);
    n_past[s] = static_cast<int32_t>(prompts[s].size());
  }
  for (int step = 0; step < 4; ++step) {
    const int n = step < 2 ? 3 : 2;
    ForwardBatch b;
    for (int s = 0; s < n; ++s) {
      b.token_ids.push_back(next[s]);
      b.seqs.push_back({1, n_past[s], table(s), true});
    }
    std::vector<int32_t> ids(n);
    std::vector<float> lps(n);
    f.graphed->forward_sampled(b, cache, {rows.data(), static_cast<size_t>(n)}, ids.data(), lps.data());
    for (int s = 0; s < n; ++s) {
      EXPECT_EQ(ids[s], argmax(want[step].data() + s * vocab, vocab)) << "step " << step << " seq " << s;
      ++n_past[s];
      next[s] = ids[s];
    }
  }
  EXPECT_EQ(f.fake.n_device_samples, 7);
  EXPECT_GT(f.graphed->decode_graphs()->cache().n_replays(), 0);
  // The CPU backend has no device sampler: refused, naming it.
  KvCache c2 = f.eager->make_kv_cache(8, 4, DType::kF32);
  ForwardBatch b;
  b.token_ids = {5};
  b.seqs.push_back({1, 0, {0}, true});
  int32_t id = -1;
  EXPECT_THROW(f.eager->forward_sampled(b, c2, {rows.data(), 1}, &id, nullptr), Error);
}

}  // namespace
}  // namespace shardlm
