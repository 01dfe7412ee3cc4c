// A family is two files: Phi-3's fused qkv_proj and gate_up_proj reach the
// Llama-shaped graph through plan's fused-part slices; Gemma 3 builds its own
// layer (sandwich norms, GeGLU, local layers with a sliding window). Every
// TP × PP layout gives the TP=1 tokens and logits, and the bytes a rank holds
// are plan's.
#include <gtest/gtest.h>

#include <cmath>

#include "loader/model_catalog.h"
#include "model/causal_lm.h"
#include "model/generate.h"
#include "plan/sharding.h"
#include "random_weights.h"

namespace shardlm {
namespace {

using testing::qwen25_7b_like;
using testing::random_weights;

ModelSpec small_phi4() {
  ModelSpec s = qwen25_7b_like(160, 3, 96, 320);
  s.architecture = "Phi3ForCausalLM";
  s.model_type = "phi3";
  s.family = Family::kPhi3;
  s.n_heads = 10;  // phi-4's 4:1 GQA
  s.n_kv_heads = 5;
  s.head_dim = 16;
  s.qkv_bias = false;
  s.rope_theta = 250000.0;
  return s;
}

GenerateResult run(const ModelSpec& spec, std::shared_ptr<const WeightSource> w, int tp, int pp) {
  GenerateOptions opt;
  opt.layout.tp = tp;
  opt.layout.pp = pp;
  opt.max_tokens = 4;
  opt.block_size = 4;
  return generate_local(spec, std::move(w), {5, 17, 101, 3, 250, 77}, opt, /*keep_all_logits=*/true);
}

// max |a - b| over every step's logits, relative to b's largest.
double worst_relative(const GenerateResult& a, const GenerateResult& b) {
  double worst = 0, scale = 1e-6;
  for (size_t s = 0; s < a.step_logits.size() && s < b.step_logits.size(); ++s)
    for (size_t i = 0; i < a.step_logits[s].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::fabs(a.step_logits[s][i] - b.step_logits[s][i])));
      scale = std::max(scale, static_cast<double>(std::fabs(b.step_logits[s][i])));
    }
  return worst / scale;
}

TEST(Phi3, FusedPartsAgreeAcrossLayouts) {
  const ModelSpec spec = small_phi4();
  auto w = random_weights(spec, 11);
  const GenerateResult base = run(spec, w, 1, 1);
  ASSERT_EQ(base.tokens.size(), 4u);
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{4, 2}, std::pair{7, 1}, std::pair{3, 3}}) {
    const GenerateResult r = run(spec, w, tp, pp);
    EXPECT_EQ(r.tokens, base.tokens) << "TP=" << tp << " PP=" << pp;
    EXPECT_LT(worst_relative(r, base), 2e-4) << "TP=" << tp << " PP=" << pp;
    EXPECT_EQ(r.weight_bytes_rank0, rank_weight_bytes(spec, Layout{tp, pp}, 0, 0)) << "TP=" << tp;
  }
}

// Plan's slices of a fused tensor: one per part, each a row range of the
// part's own split, offset by the parts before it.
TEST(Phi3, PlanSlicesFusedTensorsByParts) {
  const ModelSpec spec = small_phi4();
  const Layout layout{3, 1};
  std::vector<TensorShard> qkv, gate_up;
  for (const TensorShard& t : rank_tensors(spec, layout, 1, 0)) {
    if (t.name == "model.layers.0.self_attn.qkv_proj.weight") qkv.push_back(t);
    if (t.name == "model.layers.0.mlp.gate_up_proj.weight") gate_up.push_back(t);
  }
  // Rank 1 of 3: Q heads [4, 7) of 10, so KV heads [2, 4) of 5 (group 2).
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_EQ(qkv[0].slice, (Range{4 * 16, 7 * 16}));
  EXPECT_EQ(qkv[1].slice, (Range{160 + 2 * 16, 160 + 4 * 16}));
  EXPECT_EQ(qkv[2].slice, (Range{160 + 80 + 2 * 16, 160 + 80 + 4 * 16}));
  for (int p = 0; p < 3; ++p) EXPECT_EQ(qkv[p].fused_part, p);
  // 96 columns in 16-wide units over 3: 32 each; gate rows then up rows.
  ASSERT_EQ(gate_up.size(), 2u);
  EXPECT_EQ(gate_up[0].slice, (Range{32, 64}));
  EXPECT_EQ(gate_up[1].slice, (Range{96 + 32, 96 + 64}));
  EXPECT_EQ(gate_up[1].local_shape, (std::vector<int64_t>{32, 160}));
}

ModelSpec small_gemma3(int64_t window) {
  ModelSpec s = catalog_model_spec("gemma-3-1b");
  s.vocab_size = 320;
  s.hidden_size = 96;
  s.intermediate_size = 128;
  s.n_layers = 4;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.sliding_window = window;
  s.sliding_layers = {true, false, true, true};
  s.eos_token_ids.clear();
  s.bos_token_id = -1;
  return s;
}


// Uneven TP (4 Q heads over 3: 2/1/1, KV heads shared), PP splits between a
// local and a global layer; the 6-token prompt crosses the 3-position window.
TEST(Gemma3, LayoutsAgreeAndTheWindowMatters) {
  const ModelSpec spec = small_gemma3(3);
  auto w = random_weights(spec, 21);
  const GenerateResult base = run(spec, w, 1, 1);
  ASSERT_EQ(base.tokens.size(), 4u);
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{3, 1}, std::pair{2, 2}, std::pair{1, 4}}) {
    const GenerateResult r = run(spec, w, tp, pp);
    EXPECT_EQ(r.tokens, base.tokens) << "TP=" << tp << " PP=" << pp;
    EXPECT_LT(worst_relative(r, base), 2e-4) << "TP=" << tp << " PP=" << pp;
    EXPECT_EQ(r.weight_bytes_rank0, rank_weight_bytes(spec, Layout{tp, pp}, 0, 0)) << "TP=" << tp << " PP=" << pp;
  }
  // A window longer than the sequence is full attention: different logits from window 3.
  const GenerateResult wide = run(small_gemma3(64), w, 1, 1);
  EXPECT_GT(worst_relative(wide, base), 1e-3);
}

}  // namespace
}  // namespace shardlm
