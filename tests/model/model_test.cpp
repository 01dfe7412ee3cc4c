// Model tests: every TP × PP layout gives the TP=1 tokens and logits; chunked
// prefill, batching and KV dtypes agree; weights held per rank are what plan
// says; bad checkpoints fail with the tensor named.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "comm/communicator.h"
#include "comm/local_comm.h"
#include "core/error.h"
#include "model/causal_lm.h"
#include "model/generate.h"
#include "random_weights.h"

namespace shardlm {
namespace {

std::shared_ptr<backend::Backend> cpu() { return backend::make_backend({}); }


using testing::qwen25_7b_like;
using testing::random_weights;

const std::vector<int32_t> kPrompt{5, 17, 101, 3, 250, 77, 9};

// Largest |a - b| over all steps, relative to the largest |logit| of the reference.
double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0.0, scale = 1e-6;
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s)
    for (size_t i = 0; i < a[s].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(a[s][i] - b[s][i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b[s][i])));
    }
  return worst / scale;
}

GenerateResult run(const ModelSpec& spec, std::shared_ptr<const WeightSource> w, int tp, int pp, int64_t max_tokens = 4,
                   DType kv = DType::kF32, int64_t chunk = 0) {
  GenerateOptions opt;
  opt.layout.tp = tp;
  opt.layout.pp = pp;
  opt.max_tokens = max_tokens;
  opt.kv_dtype = kv;
  opt.block_size = 4;
  opt.prefill_chunk = chunk;
  return generate_local(spec, std::move(w), kPrompt, opt, /*keep_all_logits=*/true);
}

// Tolerance for a different summation order across ranks (all_reduce of
// partial o_proj/down_proj sums): relative to the largest logit.
constexpr double kLayoutTolerance = 2e-4;

TEST(CausalLM, TensorParallel1To8MatchesTp1OnQwen25_7bShapes) {
  // Real Qwen2.5-7B attention (hidden 3584, 28 Q / 4 KV heads, head_dim 128),
  // 2 layers, narrow MLP and vocabulary to keep it fast.
  ModelSpec spec = qwen25_7b_like(3584, 2, 1024, 512);
  auto w = random_weights(spec, 1);
  GenerateResult base = run(spec, w, 1, 1);
  ASSERT_EQ(base.tokens.size(), 4u);
  for (int tp = 2; tp <= 8; ++tp) {
    GenerateResult r = run(spec, w, tp, 1);
    EXPECT_EQ(r.tokens, base.tokens) << "TP=" << tp;
    EXPECT_LT(max_rel_diff(r.step_logits, base.step_logits), kLayoutTolerance) << "TP=" << tp;
  }
}

TEST(CausalLM, EveryTpPpLayoutMatchesTp1) {
  // Qwen2.5-7B heads on a narrower residual (hidden 1024, explicit head_dim
  // 128) and 4 layers, so 3 stages split them unevenly.
  ModelSpec spec = qwen25_7b_like(1024, 4, 512, 384);
  auto w = random_weights(spec, 2);
  GenerateResult base = run(spec, w, 1, 1);
  for (int pp = 1; pp <= 3; ++pp)
    for (int tp = 1; tp <= 8; ++tp) {
      if (tp == 1 && pp == 1) continue;
      GenerateResult r = run(spec, w, tp, pp);
      EXPECT_EQ(r.tokens, base.tokens) << "TP=" << tp << " PP=" << pp;
      EXPECT_LT(max_rel_diff(r.step_logits, base.step_logits), kLayoutTolerance) << "TP=" << tp << " PP=" << pp;
    }
}

TEST(CausalLM, ChunkedPrefillAndBf16CacheAgree) {
  ModelSpec spec = qwen25_7b_like(512, 2, 256, 300);
  auto w = random_weights(spec, 3);
  GenerateResult whole = run(spec, w, 1, 1, 5);
  for (int64_t chunk : {1, 3}) {
    GenerateResult r = run(spec, w, 1, 1, 5, DType::kF32, chunk);
    EXPECT_EQ(r.tokens, whole.tokens) << "chunk " << chunk;
    EXPECT_LT(max_rel_diff(r.step_logits, whole.step_logits), 1e-5) << "chunk " << chunk;
  }
  GenerateResult bf16 = run(spec, w, 2, 1, 5, DType::kBF16, 2);
  EXPECT_LT(max_rel_diff(bf16.step_logits, whole.step_logits), 3e-2);
}

TEST(CausalLM, BatchedSequencesMatchSeparateRuns) {
  ModelSpec spec = qwen25_7b_like(512, 2, 256, 300);
  auto w = random_weights(spec, 4);
  SoloComm tp, pp;
  auto model = CausalLM::load(spec, w, Layout{}, 0, 0, tp, pp, cpu());
  const int64_t vocab = spec.vocab_size;
  // Separately: A = 5 prompt tokens, B = 3 prompt tokens then 1 decode token.
  std::vector<int32_t> a{1, 2, 3, 4, 5}, b{9, 8, 7}, b_next{42};
  std::vector<float> la(vocab), lb(vocab), lb2(vocab);
  {
    KvCache cache = model->make_kv_cache(8, 4, DType::kF32);
    ForwardBatch fa;
    fa.token_ids = a;
    fa.seqs.push_back({5, 0, {0, 1}, true});
    ASSERT_TRUE(model->forward(fa, cache, la.data()));
    ForwardBatch fb;
    fb.token_ids = b;
    fb.seqs.push_back({3, 0, {2}, true});
    model->forward(fb, cache, lb.data());
    ForwardBatch fb2;
    fb2.token_ids = b_next;
    fb2.seqs.push_back({1, 3, {2}, true});
    model->forward(fb2, cache, lb2.data());
  }
  // Together: B's prompt and A's prompt in one batch (other blocks), then B's decode.
  KvCache cache = model->make_kv_cache(8, 4, DType::kF32);
  ForwardBatch both;
  both.token_ids = {9, 8, 7, 1, 2, 3, 4, 5};
  both.seqs.push_back({3, 0, {6}, true});
  both.seqs.push_back({5, 0, {3, 5}, true});
  std::vector<float> out(2 * vocab);
  model->forward(both, cache, out.data());
  ForwardBatch next;
  next.token_ids = b_next;
  next.seqs.push_back({1, 3, {6}, true});
  std::vector<float> out2(vocab);
  model->forward(next, cache, out2.data());
  for (int64_t i = 0; i < vocab; ++i) {
    EXPECT_NEAR(out[i], lb[i], 1e-4) << i;
    EXPECT_NEAR(out[vocab + i], la[i], 1e-4) << i;
    EXPECT_NEAR(out2[i], lb2[i], 1e-4) << i;
  }
}

TEST(CausalLM, RankWeightsEqualPlanBytes) {
  ModelSpec spec = qwen25_7b_like(512, 3, 272, 300);
  spec.tie_word_embeddings = true;
  auto w = random_weights(spec, 5);
  for (Layout layout : {Layout{1, 1, 1, {}}, Layout{3, 2, 1, {}}, Layout{5, 3, 1, {}}}) {
    run_local_ranks(layout.tp * layout.pp, [&](Communicator& world) {
      RankComms c = split_rank_comms(world, layout);
      const int tp = world.rank() % layout.tp, pp = world.rank() / layout.tp;
      auto m = CausalLM::load(spec, w, layout, tp, pp, *c.tp, *c.pp, cpu());
      EXPECT_EQ(m->weight_bytes(), rank_weight_bytes(spec, layout, tp, pp)) << layout.to_string() << " rank " << world.rank();
      if (layout.tp == 1) EXPECT_EQ(m->copied_bytes(), 0);
      else EXPECT_GT(m->copied_bytes(), 0);
      // KV bytes per block: 2 × layers on stage × KV heads on rank × head_dim × 2 bytes × block size.
      EXPECT_EQ(m->kv_block_bytes(16, DType::kBF16),
                2 * m->shard().layers.size() * m->shard().kv_heads.size() * 128 * 2 * 16);
    });
  }
}

ModelSpec small_qwen3(bool tied) {
  ModelSpec s = qwen25_7b_like(256, 3, 256, 320);
  s.architecture = "Qwen3ForCausalLM";
  s.model_type = "qwen3";
  s.family = Family::kQwen3;
  s.n_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = 64;
  s.qkv_bias = false;
  s.qk_norm = true;
  s.tie_word_embeddings = tied;
  return s;
}

TEST(CausalLM, Qwen3TiedAndLlama3ScaledAgreeAcrossLayouts) {
  ModelSpec q3 = small_qwen3(true);
  auto wq = random_weights(q3, 6);
  GenerateResult base = run(q3, wq, 1, 1);
  for (auto [tp, pp] : {std::pair{4, 1}, std::pair{5, 2}, std::pair{3, 3}}) {
    GenerateResult r = run(q3, wq, tp, pp);
    EXPECT_EQ(r.tokens, base.tokens) << "qwen3 TP=" << tp << " PP=" << pp;
    EXPECT_LT(max_rel_diff(r.step_logits, base.step_logits), kLayoutTolerance);
  }
  ModelSpec ll = small_qwen3(false);
  ll.architecture = "LlamaForCausalLM";
  ll.model_type = "llama";
  ll.family = Family::kLlama;
  ll.qk_norm = false;
  ll.rope_theta = 500000.0;
  ll.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  auto wl = random_weights(ll, 7);
  GenerateResult lbase = run(ll, wl, 1, 1, 6);
  GenerateResult lr = run(ll, wl, 3, 2, 6);
  EXPECT_EQ(lr.tokens, lbase.tokens);
  EXPECT_LT(max_rel_diff(lr.step_logits, lbase.step_logits), kLayoutTolerance);
}

TEST(CausalLM, MissingOrMisshapenTensorIsNamed) {
  ModelSpec spec = small_qwen3(true);
  auto w = random_weights(spec, 8);
  ModelSpec wrong = spec;
  wrong.intermediate_size = 128;
  SoloComm tp, pp;
  try {
    CausalLM::load(wrong, w, Layout{}, 0, 0, tp, pp, cpu());
    FAIL() << "loaded a checkpoint with the wrong MLP width";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight has shape [256, 256]"), std::string::npos)
        << e.what();
  }
  auto partial = std::make_shared<MemoryWeightSource>();
  try {
    CausalLM::load(spec, partial, Layout{}, 0, 0, tp, pp, cpu());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos) << e.what();
  }
  // Token ids outside the vocabulary are refused, not read out of bounds.
  auto m = CausalLM::load(spec, w, Layout{}, 0, 0, tp, pp, cpu());
  KvCache cache = m->make_kv_cache(2, 4, DType::kF32);
  ForwardBatch b;
  b.token_ids = {static_cast<int32_t>(spec.vocab_size)};
  b.seqs.push_back({1, 0, {0}, true});
  std::vector<float> logits(spec.vocab_size);
  EXPECT_THROW(m->forward(b, cache, logits.data()), Error);
}

}  // namespace
}  // namespace shardlm
