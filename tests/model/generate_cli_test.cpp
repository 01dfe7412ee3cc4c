// `shardlm generate` end to end on a synthetic checkpoint written by
// `shardlm make-model`: --tp/--pp give the TP=1 tokens and logits, --json
// is one object, --dump-logits is [vocab] f32, bad input exits 1 with reasons.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/process.h"
#include "tokenizer/tokenizer.h"

namespace {

using Proc = shardlm::testing::CommandResult;  // out: stdout and stderr

Proc sh(const std::string& cmd) { return shardlm::testing::run_command(cmd, /*merge_stderr=*/true); }

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* cli = std::getenv("SHARDLM_CLI");
    const char* build = std::getenv("SHARDLM_BINARY_DIR");
    cli_ = cli ? cli : SHARDLM_CLI_PATH;
    // ctest runs each test of this suite as its own process, several at a
    // time: each gets its own model directory so none reads a half-written one.
    dir_ = std::string(build ? build : SHARDLM_BUILD_DIR) + "/tests/model/generate_cli_model." + std::to_string(getpid());
    Proc r = sh(cli_ + " make-model --like qwen2.5-0.5b --layers 3 --vocab 400 --intermediate 1024 --dtype bf16 --seed 11 --out " + dir_);
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string cli_, dir_;
};
std::string GenerateCli::cli_, GenerateCli::dir_;

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

TEST_F(GenerateCli, LayoutsGiveTheSameTokensAndLogits) {
  const std::string base = cli_ + " generate " + dir_ + " --prompt-ids 3,141,59,26,5 --max-tokens 6 --json";
  Proc one = sh(base + " --dump-logits " + dir_ + "/tp1.logits");
  ASSERT_EQ(one.rc, 0) << one.out;
  auto j1 = nlohmann::json::parse(one.out);
  EXPECT_EQ(j1["prompt_token_ids"], nlohmann::json({3, 141, 59, 26, 5}));
  EXPECT_EQ(j1["token_ids"].size(), 6u);
  EXPECT_EQ(j1["finish_reason"], "length");
  auto l1 = read_f32(dir_ + "/tp1.logits");
  ASSERT_EQ(l1.size(), 400u);
  for (auto [tp, pp] : {std::pair{3, 2}, std::pair{2, 3}}) {
    const std::string f = dir_ + "/tp" + std::to_string(tp) + "pp" + std::to_string(pp) + ".logits";
    Proc r = sh(base + " --tp " + std::to_string(tp) + " --pp " + std::to_string(pp) + " --dump-logits " + f);
    ASSERT_EQ(r.rc, 0) << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["token_ids"], j1["token_ids"]) << "TP=" << tp << " PP=" << pp;
    auto l = read_f32(f);
    ASSERT_EQ(l.size(), l1.size());
    float scale = 1.0f, worst = 0.0f;
    for (size_t i = 0; i < l.size(); ++i) {
      scale = std::max(scale, std::fabs(l1[i]));
      worst = std::max(worst, std::fabs(l[i] - l1[i]));
    }
    EXPECT_LT(worst / scale, 2e-4f) << "TP=" << tp << " PP=" << pp;
  }
}

TEST_F(GenerateCli, SeededSamplingRepeatsAndGreedyIsDefault) {
  const std::string base = cli_ + " generate " + dir_ + " --prompt-ids 7,8,9 --max-tokens 8 --json";
  Proc a = sh(base + " --temperature 1.5 --top-k 50 --seed 42");
  Proc b = sh(base + " --temperature 1.5 --top-k 50 --seed 42 --tp 2");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["token_ids"], nlohmann::json::parse(b.out)["token_ids"]);
  Proc g = sh(base);
  Proc g0 = sh(base + " --temperature 0");
  ASSERT_EQ(g.rc, 0) << g.out;
  EXPECT_EQ(nlohmann::json::parse(g.out)["token_ids"], nlohmann::json::parse(g0.out)["token_ids"]);
}

TEST_F(GenerateCli, PromptTextIsTokenizedAndOutputDetokenized) {
  Proc t = sh(cli_ + " generate " + dir_ + " --prompt 'Hello world' --max-tokens 5 --json");
  ASSERT_EQ(t.rc, 0) << t.out;
  auto jt = nlohmann::json::parse(t.out);
  ASSERT_FALSE(jt["prompt_token_ids"].empty());
  std::string ids;
  for (const auto& id : jt["prompt_token_ids"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
  Proc i = sh(cli_ + " generate " + dir_ + " --prompt-ids " + ids + " --max-tokens 5 --json");
  ASSERT_EQ(i.rc, 0) << i.out;
  auto ji = nlohmann::json::parse(i.out);
  EXPECT_EQ(ji["token_ids"], jt["token_ids"]);
  EXPECT_EQ(ji["text"], jt["text"]);
  EXPECT_FALSE(jt["text"].get<std::string>().empty());
}

TEST_F(GenerateCli, ChatRendersTheTemplateOrSaysWhyNot) {
  Proc c = sh(cli_ + " generate " + dir_ + " --chat 'Hello there' --max-tokens 3 --json");
#if __has_include("tokenizer/chat_template/chat_template.h")
  ASSERT_EQ(c.rc, 0) << c.out;
  // make-model's Qwen2.5 template with one user message, as jinja2 renders it.
  const std::string rendered =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
      "<|im_start|>assistant\n";
  const auto want = shardlm::Tokenizer::load(dir_).encode(rendered, /*add_special_tokens=*/false);
  EXPECT_EQ(nlohmann::json::parse(c.out)["prompt_token_ids"], nlohmann::json(want));
#else
  EXPECT_EQ(c.rc, 1);
  EXPECT_NE(c.out.find("--chat needs the chat template renderer"), std::string::npos) << c.out;
#endif
}

// Without mpirun the run has one rank: plan's choice is TP=1, and says so.
TEST_F(GenerateCli, TpAutoAsksPlanAndTakesItsLayout) {
  const std::string base = cli_ + " generate " + dir_ + " --prompt-ids 3,141,59 --max-tokens 4 --json";
  Proc one = sh(base);
  Proc r = sh(base + " -tp auto");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("-tp auto: plan chose TP=1 PP=1 DP=1 for 1 × CPU rank"), std::string::npos) << r.out;
  const auto json_of = [](const std::string& out) { return nlohmann::json::parse(out.substr(out.find('{'))); };
  EXPECT_EQ(json_of(r.out)["token_ids"], json_of(one.out)["token_ids"]);
  r = sh(base + " -tp auto -pp 2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("-tp auto chooses TP, PP and DP together"), std::string::npos) << r.out;
  r = sh(base + " -tp two");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--tensor-parallel-size \"two\": give a degree from 1 to 4096, or auto"), std::string::npos)
      << r.out;
}

TEST_F(GenerateCli, BadInputsExplainThemselves) {
  const std::string base = cli_ + " generate " + dir_ + " --max-tokens 2";
  Proc r = sh(base + " --prompt-ids 1,x,3");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--prompt-ids: \"x\" is not a token id"), std::string::npos) << r.out;
  r = sh(base + " --prompt-ids 1,400");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("token id 400"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[0, 400)"), std::string::npos) << r.out;
  r = sh(base + " --prompt-ids 1 --tp 15");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("exceeds the model's 14 attention heads"), std::string::npos) << r.out;
  r = sh(base + " --prompt-ids 1 --prompt hi");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("exactly one of"), std::string::npos) << r.out;
  r = sh(base + " --prompt-ids 1 --temperature 3");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("temperature"), std::string::npos) << r.out;
  r = sh(cli_ + " generate " + dir_ + "/nope --prompt-ids 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
  // MoE flags on this dense model are refused, naming the flag.
  r = sh(base + " --prompt-ids 1 --tp 2 --enable-expert-parallel");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--enable-expert-parallel"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dense model"), std::string::npos) << r.out;
  r = sh(base + " --prompt-ids 1 --dump-routing " + dir_ + "/routing.json");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--dump-routing"), std::string::npos) << r.out;
}

// A MoE checkpoint: the routing dump has one row of top-k experts per position
// fed for every sparse layer (dense layers absent), and needs --pp 1.
TEST_F(GenerateCli, MoeRoutingDumpHasTopKPerPositionAndSparseLayers) {
  const std::string moe = dir_ + "_moe";
  Proc r = sh(cli_ + " make-model --like qwen3-30b-a3b --layers 3 --vocab 400 --hidden 128 --heads 4 --kv-heads 2 "
              "--head-dim 32 --intermediate 96 --experts 10 --experts-per-token 3 --moe-intermediate 32 "
              "--mlp-only-layers 1 --seed 2 --out " + moe);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string dump = moe + "/routing.json";
  r = sh(cli_ + " generate " + moe + " --prompt-ids 5,6,7,8 --max-tokens 3 --json --tp 2 --enable-expert-parallel "
         "--dump-routing " + dump);
  ASSERT_EQ(r.rc, 0) << r.out;
  std::ifstream in(dump);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["top_k"], 3);
  ASSERT_EQ(j["layers"].size(), 2u);  // layers 0 and 2; layer 1 is dense
  for (const char* l : {"0", "2"}) {
    ASSERT_EQ(j["layers"][l].size(), 6u) << l;  // 4 prompt positions + 2 generated tokens fed back
    for (const auto& row : j["layers"][l]) {
      ASSERT_EQ(row.size(), 3u);
      std::set<int> distinct;
      for (const auto& e : row) {
        EXPECT_GE(e.get<int>(), 0);
        EXPECT_LT(e.get<int>(), 10);
        distinct.insert(e.get<int>());
      }
      EXPECT_EQ(distinct.size(), 3u);
    }
  }
  r = sh(cli_ + " generate " + moe + " --prompt-ids 5 --max-tokens 2 --pp 2 --dump-routing " + dump);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--pipeline-parallel-size 1"), std::string::npos) << r.out;
  std::filesystem::remove_all(moe);
}

}  // namespace

namespace {

// --quant-activations picks the AWQ kernels' activations: f32 from the flag is
// f32 from the environment (bit for bit), int8 is the default and differs
// from f32 where VNNI runs, and a bad value (flag or variable) stops the
// command, naming it, before the model loads.
TEST_F(GenerateCli, QuantActivationsFlagChoosesTheKernelsAndRefusesBadValues) {
  const std::string awq = dir_ + "_awq";
  Proc r = sh(cli_ + " make-model --like qwen2.5-0.5b --layers 2 --vocab 400 --intermediate 256 --quantize awq --seed 4 "
              "--out " + awq);
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string base = cli_ + " generate " + awq + " --prompt-ids 3,141,59,26,5 --max-tokens 3 --json --dump-logits ";
  auto logits = [&](const std::string& env, const std::string& flag, const std::string& name) {
    Proc g = sh(env + base + awq + "/" + name + ".logits" + flag);
    EXPECT_EQ(g.rc, 0) << g.out;
    return read_f32(awq + "/" + name + ".logits");
  };
  const auto f32_flag = logits("", " --quant-activations f32", "f32_flag");
  const auto f32_env = logits("SHARDLM_QUANT_ACTIVATIONS=f32 ", "", "f32_env");
  const auto int8_flag = logits("SHARDLM_QUANT_ACTIVATIONS=f32 ", " --quant-activations int8", "int8_flag");
  const auto int8_default = logits("", "", "int8_default");
  ASSERT_EQ(f32_flag.size(), 400u);
  EXPECT_EQ(f32_flag, f32_env);
  EXPECT_EQ(int8_flag, int8_default);  // the flag wins over the environment
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  EXPECT_NE(int8_default, f32_flag);
#endif
  r = sh(base + awq + "/bad.logits --quant-activations int4");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--quant-activations 'int4': use int8"), std::string::npos) << r.out;
  r = sh("SHARDLM_QUANT_ACTIVATIONS=fp16 " + cli_ + " generate /nonexistent --prompt-ids 1");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("SHARDLM_QUANT_ACTIVATIONS is 'fp16'"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("config.json"), std::string::npos) << r.out;  // refused before the model is read
  r = sh(cli_ + " perplexity " + awq + " /dev/null --quant-activations x");
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("--quant-activations 'x'"), std::string::npos) << r.out;
  std::filesystem::remove_all(awq);
}

// --speculative-config (ngram): through the CLI, the greedy tokens equal those
// without it, on a copy-heavy prompt whose drafts get accepted; --batch-invariant
// alone changes no token; seeded sampling keeps its tokens too; what is not
// implemented is refused, naming the key.
TEST_F(GenerateCli, SpeculativeNgramKeepsGreedyTokensAndRefusesWhatItLacks) {
  std::string ids;
  for (int rep = 0; rep < 4; ++rep)
    for (int t : {17, 93, 201, 5, 66, 140, 33}) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string base = cli_ + " generate " + dir_ + " --prompt-ids " + ids + " --max-tokens 24 --json";
  const std::string cfg =
      R"( --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":2}')";
  Proc plain = sh(base);
  Proc inv = sh(base + " --batch-invariant");
  Proc spec = sh(base + cfg);
  ASSERT_EQ(plain.rc, 0) << plain.out;
  ASSERT_EQ(inv.rc, 0) << inv.out;
  ASSERT_EQ(spec.rc, 0) << spec.out;
  const auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(nlohmann::json::parse(inv.out)["token_ids"], p["token_ids"]);
  EXPECT_EQ(s["token_ids"], p["token_ids"]);
  EXPECT_GT(s["speculative"]["num_accepted_tokens"].get<int64_t>(), 0) << spec.out;
  EXPECT_LE(s["speculative"]["num_accepted_tokens"].get<int64_t>(), s["speculative"]["num_draft_tokens"].get<int64_t>());
  Proc model = sh(base + R"( --speculative-config '{"model":"/nonexistent/draft","num_speculative_tokens":4}')");
  EXPECT_EQ(model.rc, 1);
  EXPECT_NE(model.out.find("/nonexistent/draft/config.json not found"), std::string::npos) << model.out;
  Proc unknown = sh(base + R"( --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"typo":1}')");
  EXPECT_EQ(unknown.rc, 1);
  EXPECT_NE(unknown.out.find("unknown key \"typo\""), std::string::npos) << unknown.out;
  Proc bound = sh(base + R"( --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"disable_by_batch_size":0}')");
  EXPECT_EQ(bound.rc, 1);
  EXPECT_NE(bound.out.find("\"disable_by_batch_size\" must be at least 1"), std::string::npos) << bound.out;
  // Sampled: verification draws each row with the same seeded RNG plain
  // decoding uses (rejection sampling in its coupled form), so the tokens
  // equal those of plain decoding on the same kernels.
  Proc hot_plain = sh(base + " --temperature 0.8 --seed 7 --batch-invariant");
  Proc hot = sh(base + " --temperature 0.8 --seed 7" + cfg);
  ASSERT_EQ(hot_plain.rc, 0) << hot_plain.out;
  ASSERT_EQ(hot.rc, 0) << hot.out;
  EXPECT_EQ(nlohmann::json::parse(hot.out)["token_ids"], nlohmann::json::parse(hot_plain.out)["token_ids"]);
}

// --speculative-config '{"model": DIR}': a draft model proposes, the target
// verifies, and the greedy tokens are the target's alone, at TP 1 and over
// uneven TP 2 (the draft runs whole on the driver). The target as its own
// draft has every draft accepted (so verification's accept path is taken);
// a one-layer draft has some rejected (its rollback path). A draft with
// another tokenizer is refused naming both directories, by serve too.
TEST_F(GenerateCli, DraftModelKeepsTheTargetsGreedyTokens) {
  const std::string small = dir_ + ".draft1", other = dir_ + ".vocab512";
  ASSERT_EQ(sh(cli_ + " make-model --like qwen2.5-0.5b --layers 1 --vocab 400 --intermediate 1024 --dtype bf16 "
               "--seed 12 --out " + small).rc, 0);
  ASSERT_EQ(sh(cli_ + " make-model --like qwen2.5-0.5b --layers 1 --vocab 512 --intermediate 1024 --dtype bf16 "
               "--seed 12 --out " + other).rc, 0);
  const std::string base = cli_ + " generate " + dir_ + " --prompt-ids 3,141,59,26,5,35,89,79 --max-tokens 20 --json";
  auto draft_cfg = [](const std::string& d) {
    return " --speculative-config '{\"model\":\"" + d + "\",\"num_speculative_tokens\":3}'";
  };
  Proc plain = sh(base + " --batch-invariant");
  ASSERT_EQ(plain.rc, 0) << plain.out;
  const auto want = nlohmann::json::parse(plain.out)["token_ids"];
  for (const std::string tp : {"1", "2"}) {
    Proc self = sh(base + " -tp " + tp + draft_cfg(dir_));
    ASSERT_EQ(self.rc, 0) << self.out;
    const auto s = nlohmann::json::parse(self.out);
    EXPECT_EQ(s["token_ids"], want) << "tp " << tp;
    EXPECT_GT(s["speculative"]["num_drafts"].get<int64_t>(), 0) << self.out;
    EXPECT_EQ(s["speculative"]["num_accepted_tokens"], s["speculative"]["num_draft_tokens"])
        << "the target as its own draft: every draft is what it produces; " << self.out;
    EXPECT_GT(s["speculative"]["draft_weight_bytes"].get<int64_t>(), 0) << self.out;
    EXPECT_GT(s["speculative"]["draft_kv_bytes"].get<int64_t>(), 0) << self.out;
    Proc one_layer = sh(base + " -tp " + tp + draft_cfg(small));
    ASSERT_EQ(one_layer.rc, 0) << one_layer.out;
    const auto o = nlohmann::json::parse(one_layer.out);
    EXPECT_EQ(o["token_ids"], want) << "tp " << tp;
    EXPECT_LT(o["speculative"]["num_accepted_tokens"].get<int64_t>(),
              o["speculative"]["num_draft_tokens"].get<int64_t>())
        << "no draft of the one-layer model was rejected: the rollback went untested; " << one_layer.out;
  }
  // Sampled: the same seeded tokens as plain decoding on the same kernels.
  Proc hot_plain = sh(base + " --temperature 0.8 --seed 3 --batch-invariant");
  Proc hot = sh(base + " --temperature 0.8 --seed 3" + draft_cfg(small));
  ASSERT_EQ(hot.rc, 0) << hot.out;
  EXPECT_EQ(nlohmann::json::parse(hot.out)["token_ids"], nlohmann::json::parse(hot_plain.out)["token_ids"]);
  Proc mismatch = sh(base + draft_cfg(other));
  EXPECT_EQ(mismatch.rc, 1);
  EXPECT_NE(mismatch.out.find("the draft's tokenizer is not the target's"), std::string::npos) << mismatch.out;
  EXPECT_NE(mismatch.out.find("target " + dir_), std::string::npos) << mismatch.out;
  EXPECT_NE(mismatch.out.find("draft " + other), std::string::npos) << mismatch.out;
  Proc lookup = sh(base + R"( --speculative-config '{"model":")" + small +
                   R"(","num_speculative_tokens":3,"prompt_lookup_max":4}')");
  EXPECT_EQ(lookup.rc, 1);
  EXPECT_NE(lookup.out.find("\"prompt_lookup_max\" is a key of method ngram"), std::string::npos) << lookup.out;
  // serve checks the draft's vocabulary at load too, and exits.
  Proc serve = sh(cli_ + " serve " + dir_ + " --port 0" + draft_cfg(other));
  EXPECT_EQ(serve.rc, 1);
  EXPECT_NE(serve.out.find("the draft's tokenizer is not the target's"), std::string::npos) << serve.out;
  std::filesystem::remove_all(small);
  std::filesystem::remove_all(other);
}

}  // namespace
