// Named intermediates (model/tensor_dump.h): each family's graph names what
// its pieces compute by (name, layer); the names agree with each other (the
// residual stream after a layer is the one before plus the MLP's output),
// asking for them changes no token, and a bad name or layout is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
#include "model/generate.h"
#include "random_weights.h"

namespace shardlm {
namespace {

using testing::qwen25_7b_like;
using testing::random_weights;

const std::vector<int32_t> kPrompt{5, 17, 101, 3, 250};

ModelSpec small_qwen3() {
  ModelSpec s = qwen25_7b_like(128, 3, 96, 300);
  s.architecture = "Qwen3ForCausalLM";
  s.family = Family::kQwen3;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.qkv_bias = false;
  s.qk_norm = true;
  return s;
}

GenerateResult run(const ModelSpec& spec, std::shared_ptr<const WeightSource> w, int tp, int pp,
                   std::vector<std::string> dump) {
  GenerateOptions opt;
  opt.layout.tp = tp;
  opt.layout.pp = pp;
  opt.max_tokens = 3;
  opt.block_size = 4;
  opt.dump_tensors = std::move(dump);
  return generate_local(spec, std::move(w), kPrompt, opt);
}

TEST(TensorDump, NamesAgreeAndChangeNoToken) {
  const ModelSpec spec = small_qwen3();
  auto w = random_weights(spec, 3);
  const GenerateResult plain = run(spec, w, 1, 1, {});
  const GenerateResult r = run(spec, w, 1, 1, {"ffn_inp", "ffn_out", "l_out", "q_norm", "embd"});
  EXPECT_EQ(r.tokens, plain.tokens);
  EXPECT_TRUE(plain.tensors.empty());
  // Steps: the 5-token prompt, then 2 generated tokens fed back.
  std::map<std::string, int> count;
  for (const DumpedTensor& t : r.tensors) ++count[t.name];
  EXPECT_EQ(count["embd"], 3);
  for (const char* n : {"ffn_inp", "ffn_out", "l_out", "q_norm"}) EXPECT_EQ(count[n], 3 * 3) << n;
  // l_out[layer] = ffn_inp[layer] + ffn_out[layer], per step, in order; the
  // next layer starts from l_out.
  const DumpedTensor* inp = nullptr;
  const DumpedTensor* out = nullptr;
  int checked = 0;
  for (const DumpedTensor& t : r.tensors) {
    if (t.name == "ffn_inp") inp = &t;
    if (t.name == "ffn_out") out = &t;
    if (t.name == "q_norm" && t.layer == 0 && checked == 0) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{5, 4, 32}));  // [prompt tokens, heads, head_dim]
    }
    if (t.name != "l_out") continue;
    ASSERT_TRUE(inp && out);
    ASSERT_EQ(inp->layer, t.layer);
    ASSERT_EQ(out->layer, t.layer);
    ASSERT_EQ(t.values.size(), inp->values.size());
    EXPECT_EQ(t.shape[1], 128);
    for (size_t i = 0; i < t.values.size(); ++i)
      ASSERT_NEAR(t.values[i], inp->values[i] + out->values[i], 1e-5f * (1 + std::fabs(t.values[i]))) << t.layer;
    ++checked;
  }
  EXPECT_EQ(checked, 9);
}

// Summed over the TP group, attn_out on the driver is the TP=1 value.
TEST(TensorDump, SummedIntermediatesMatchAcrossTp) {
  const ModelSpec spec = small_qwen3();
  auto w = random_weights(spec, 4);
  const GenerateResult a = run(spec, w, 1, 1, {"attn_out"});
  const GenerateResult b = run(spec, w, 2, 1, {"attn_out"});
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    ASSERT_EQ(a.tensors[i].shape, b.tensors[i].shape);
    float scale = 1e-6f, worst = 0;
    for (size_t j = 0; j < a.tensors[i].values.size(); ++j) {
      scale = std::max(scale, std::fabs(a.tensors[i].values[j]));
      worst = std::max(worst, std::fabs(a.tensors[i].values[j] - b.tensors[i].values[j]));
    }
    EXPECT_LT(worst / scale, 1e-4f) << "step/layer entry " << i;
  }
}

TEST(TensorDump, UnknownNameAndPipelineAreRefused) {
  const ModelSpec spec = small_qwen3();
  auto w = random_weights(spec, 5);
  try {
    run(spec, w, 1, 1, {"qq"});
    ADD_FAILURE() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("\"qq\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("attn_out"), std::string::npos) << e.what();  // lists the known names
  }
  try {
    run(spec, w, 1, 2, {"l_out"});
    ADD_FAILURE() << "pp 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--pipeline-parallel-size 1"), std::string::npos) << e.what();
  }
  try {
    run(spec, w, 1, 1, {"ffn_moe_topk"});
    ADD_FAILURE() << "routing of a dense model accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dense model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
