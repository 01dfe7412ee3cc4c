#include <gtest/gtest.h>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "loader/quant_config.h"
#include "plan/sharding.h"

namespace shardlm {
namespace {

TEST(Sharding, SplitEvenGivesNearEqualContiguousRanges) {
  // 28 Q heads over 6 ranks: 5,5,5,5,4,4.
  std::vector<Range> expect = {{0, 5}, {5, 10}, {10, 15}, {15, 20}, {20, 24}, {24, 28}};
  for (int r = 0; r < 6; ++r) EXPECT_EQ(split_even(28, 6, r), expect[r]) << r;
  // Aligned: 18944 columns over 6 ranks in units of 16 = 1184 units: 198,198,197,197,197,197 units.
  EXPECT_EQ(split_even(18944, 6, 0, 16), (Range{0, 3168}));
  EXPECT_EQ(split_even(18944, 6, 5, 16), (Range{18944 - 3152, 18944}));
  // Alignment that does not divide is ignored.
  EXPECT_EQ(split_even(10, 3, 2, 16), (Range{7, 10}));
}

TEST(Sharding, Qwen7bAtTp6ReplicatesSharedKvHeads) {
  ModelSpec spec = catalog_model_spec("qwen2.5-7b");  // 28 Q heads, 4 KV heads: groups of 7
  Layout layout{6, 1, 1, {}};
  // Q ranges [0,5) [5,10) [10,15) [15,20) [20,24) [24,28); KV head = q / 7.
  std::vector<Range> kv = {{0, 1}, {0, 2}, {1, 3}, {2, 3}, {2, 4}, {3, 4}};
  for (int r = 0; r < 6; ++r) EXPECT_EQ(shard_for(spec, layout, r, 0).kv_heads, kv[r]) << r;
}

TEST(Sharding, TensorParallelShardsCoverTheModelExactly) {
  for (const char* name : {"qwen2.5-7b", "qwen2.5-14b", "qwen3-8b", "llama-3.1-8b"}) {
    ModelSpec spec = catalog_model_spec(name);
    const int64_t total = rank_weight_bytes(spec, Layout{}, 0, 0);
    for (int tp = 1; tp <= 8; ++tp) {
      Layout layout{tp, 1, 1, {}};
      int64_t sum = 0;
      for (int r = 0; r < tp; ++r) sum += rank_weight_bytes(spec, layout, r, 0);
      // Only K/V projections are replicated; count the extra by hand.
      int64_t extra_kv_heads = 0;
      for (int r = 0; r < tp; ++r) extra_kv_heads += shard_for(spec, layout, r, 0).kv_heads.size();
      extra_kv_heads -= spec.n_kv_heads;
      const int64_t per_kv_head = 2 * spec.head_dim * (spec.hidden_size + (spec.qkv_bias ? 1 : 0)) * 2;  // k+v, bf16
      // Norm weights are replicated on every rank.
      const int64_t norms = (2 * spec.n_layers + 1) * spec.hidden_size * 2 + (spec.qk_norm ? 2 * spec.n_layers * spec.head_dim * 2 : 0);
      EXPECT_EQ(sum, total + extra_kv_heads * spec.n_layers * per_kv_head + (tp - 1) * norms) << name << " tp=" << tp;
    }
  }
}

TEST(Sharding, PipelineSplitsAnyLayerCount) {
  ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  spec.vocab_size = 1024;  // make layers dominate so the split is by layer count
  spec.n_layers = 28;
  // The first and last stages also hold the (small) embedding and head, so the
  // spare layer goes to the middle — as vLLM places it: 9, 10, 9.
  EXPECT_EQ(pipeline_partition(spec, Layout{1, 3, 1, {}}), (std::vector<int64_t>{9, 10, 9}));
  spec.n_layers = 48;
  EXPECT_EQ(pipeline_partition(spec, Layout{1, 3, 1, {}}), (std::vector<int64_t>{16, 16, 16}));
  spec.n_layers = 3;
  EXPECT_EQ(pipeline_partition(spec, Layout{1, 2, 1, {}}), (std::vector<int64_t>{2, 1}));
  // Real vocabulary: the embedding weighs on stage 0 and lm_head on the last,
  // so the middle stage takes more layers.
  ModelSpec real = catalog_model_spec("qwen2.5-7b");
  auto parts = pipeline_partition(real, Layout{1, 3, 1, {}});
  EXPECT_EQ(parts[0] + parts[1] + parts[2], 28);
  EXPECT_GT(parts[1], parts[0]);
  EXPECT_EQ(pipeline_partition(real, Layout{1, 3, 1, {10, 9, 9}}), (std::vector<int64_t>{10, 9, 9}));
}

// The last stage's lm_head weighs what it stores: GPTQ-int8 with the lm_head
// quantized (GPTQModel's lm_head: true) is a quarter of the bf16 head's bytes,
// so the last stage takes back layers the bf16 head pushed off it.
TEST(Sharding, PipelineWeighsAQuantizedLmHeadByItsBytes) {
  ModelSpec spec = catalog_model_spec("llama-3.1-8b");  // untied 128256 x 4096 head: about 4 layers of bf16
  spec.n_layers = 8;
  spec.quant = published_quant_config("gptq-int8", 128, false, true, "--quantize");
  const std::vector<int64_t> bf16_head = pipeline_partition(spec, Layout{1, 2, 1, {}});
  enable_quantized_lm_head(spec.quant, "--lm-head");
  const std::vector<int64_t> int8_head = pipeline_partition(spec, Layout{1, 2, 1, {}});
  EXPECT_EQ(bf16_head[0] + bf16_head[1], 8);
  EXPECT_EQ(int8_head[0] + int8_head[1], 8);
  EXPECT_GT(int8_head[1], bf16_head[1]) << "the quantized head still counted as bf16";
}

TEST(Sharding, RejectsLayoutsTheRanksCannotRun) {
  ModelSpec spec = catalog_model_spec("qwen2.5-0.5b");  // 14 Q heads, 24 layers
  auto expect_reason = [&](Layout layout, const std::string& needle) {
    try {
      validate_layout(spec, layout);
      ADD_FAILURE() << layout.to_string();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_reason(Layout{15, 1, 1, {}}, "exceeds the model's 14 attention heads");
  expect_reason(Layout{1, 25, 1, {}}, "exceeds the model's 24 layers");
  expect_reason(Layout{1, 2, 1, {12, 11}}, "sums to 23 layers");
  expect_reason(Layout{1, 2, 1, {24}}, "has 1 entries");
  EXPECT_NO_THROW(validate_layout(spec, Layout{14, 1, 1, {}}));
  EXPECT_NO_THROW(validate_layout(spec, Layout{7, 3, 1, {}}));
}

TEST(Sharding, PipelineStagesHoldEmbeddingAndHead) {
  ModelSpec spec = catalog_model_spec("qwen2.5-0.5b");  // tied embeddings
  Layout layout{1, 2, 1, {}};
  auto first = rank_tensors(spec, layout, 0, 0);
  auto last = rank_tensors(spec, layout, 0, 1);
  auto has = [](const std::vector<TensorShard>& v, const std::string& n) {
    for (const auto& t : v) if (t.name == n) return true;
    return false;
  };
  EXPECT_TRUE(has(first, "model.embed_tokens.weight"));
  EXPECT_FALSE(has(first, "model.norm.weight"));
  EXPECT_TRUE(has(last, "model.embed_tokens.weight"));  // tied: lm_head reads these rows
  EXPECT_TRUE(has(last, "model.norm.weight"));
  EXPECT_FALSE(has(last, "lm_head.weight"));
}

TEST(WorldConfig, RanksAreTpFastestThenPpThenDp) {
  Layout layout{2, 3, 2, {}};
  WorldConfig w{7, layout};
  EXPECT_EQ(w.tp_rank(), 1);
  EXPECT_EQ(w.pp_rank(), 0);
  EXPECT_EQ(w.dp_rank(), 1);
  EXPECT_EQ(WorldConfig::rank_of(layout, 1, 0, 1), 7);
}

}  // namespace
}  // namespace shardlm
