// `shardlm plan` end to end through the binary (SHARDLM_CLI): text, --json,
// exit codes, model directories read through their safetensors headers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/process.h"

namespace {

namespace fs = std::filesystem;

using Result = shardlm::testing::CommandResult;

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* cli = std::getenv("SHARDLM_CLI");
#ifdef SHARDLM_CLI_PATH
    if (!cli || !*cli) cli = SHARDLM_CLI_PATH;
#endif
    ASSERT_NE(cli, nullptr) << "SHARDLM_CLI is not set";
    cli_ = cli;
    ASSERT_TRUE(fs::exists(cli_)) << cli_ << " is not built; build the shardlm target";
    dir_ = fs::temp_directory_path() / ("shardlm_plan_cli_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result run(const std::string& args) {
    return shardlm::testing::run_command(shardlm::testing::shell_quote(cli_) + " " + args);
  }

  // A tiny Qwen2 checkpoint: vocab 256, hidden 64, MLP 128, 2 layers, 4 Q / 2 KV heads (head_dim 16).
  void write_tiny_model(const fs::path& dir, bool bad_q_shape = false, int n_layers = 2, int vocab = 256) {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2",
      "vocab_size":)" << vocab << R"(,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":)" << n_layers
                                       << R"(,"num_attention_heads":4,
      "num_key_value_heads":2,"rms_norm_eps":1e-06,"rope_theta":1000000.0,"max_position_embeddings":4096,
      "tie_word_embeddings":false,"torch_dtype":"bfloat16","bos_token_id":1,"eos_token_id":2})";
    using Shape = std::vector<int64_t>;
    std::vector<std::pair<std::string, Shape>> file1 = {{"model.embed_tokens.weight", {vocab, 64}}};
    std::vector<std::pair<std::string, Shape>> file2 = {{"model.norm.weight", {64}}, {"lm_head.weight", {vocab, 64}}};
    for (int l = 0; l < n_layers; ++l) {
      auto& f = l == 0 ? file1 : file2;
      const std::string p = "model.layers." + std::to_string(l) + ".";
      f.push_back({p + "input_layernorm.weight", {64}});
      f.push_back({p + "self_attn.q_proj.weight", {bad_q_shape ? 60 : 64, 64}});
      f.push_back({p + "self_attn.q_proj.bias", {64}});
      f.push_back({p + "self_attn.k_proj.weight", {32, 64}});
      f.push_back({p + "self_attn.k_proj.bias", {32}});
      f.push_back({p + "self_attn.v_proj.weight", {32, 64}});
      f.push_back({p + "self_attn.v_proj.bias", {32}});
      f.push_back({p + "self_attn.o_proj.weight", {64, 64}});
      f.push_back({p + "post_attention_layernorm.weight", {64}});
      f.push_back({p + "mlp.gate_proj.weight", {128, 64}});
      f.push_back({p + "mlp.up_proj.weight", {128, 64}});
      f.push_back({p + "mlp.down_proj.weight", {64, 128}});
    }
    write_safetensors(dir / "model-00001-of-00002.safetensors", file1);
    write_safetensors(dir / "model-00002-of-00002.safetensors", file2);
  }

  static void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts) {
    nlohmann::json header = nlohmann::json::object();
    uint64_t offset = 0;
    for (const auto& [name, shape] : ts) {
      uint64_t n = 2;
      for (int64_t d : shape) n *= static_cast<uint64_t>(d);
      header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + n}}};
      offset += n;
    }
    const std::string text = header.dump();
    std::ofstream out(path, std::ios::binary);
    uint64_t len = text.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
    out << text;
    out << std::string(offset, '\0');
  }

  std::string cli_;
  fs::path dir_;
};

bool has(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

TEST_F(PlanCli, Qwen7bOnSixA100sPrintsTheRecommendationAndVllmsRefusal) {
  Result r = run("plan qwen2.5-7b --gpus 6xA100-40GB");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "Weights: 15,231,233,024 bytes = 15.23 GB = 14.19 GiB")) << r.out;
  EXPECT_TRUE(has(r.out, "KV cache: 57,344 bytes per token")) << r.out;
  EXPECT_TRUE(has(r.out, "Recommended for latency: TP=6 PP=1 DP=1")) << r.out;
  EXPECT_TRUE(has(r.out, "shardlm serve qwen2.5-7b -tp 6 -pp 1 -dp 1 --max-model-len 32768 --max-num-seqs 8")) << r.out;
  EXPECT_TRUE(has(r.out, "Total number of attention heads (28) must be divisible by tensor parallel size (6).")) << r.out;
  EXPECT_TRUE(has(r.out, "vllm serve Qwen/Qwen2.5-7B-Instruct --tensor-parallel-size 4")) << r.out;
  EXPECT_TRUE(has(r.out, "rank 0 holds 5 Q heads, rank 4 holds 4: 25.0% more attention work on rank 0")) << r.out;
  EXPECT_TRUE(has(r.out, "GiB = 2^30 bytes, GB = 10^9 bytes")) << r.out;
}

// Gemma 3 1B: its 4 Q heads over TP 3 (vLLM refuses), its KV per layer
// type, and its two pools per rank: 4 global layers × 1,024 B × 32,768 +
// 22 local × 1,024 B × (511 + 8,192) for one sequence; the local layers' pool
// is 8 × (ceil(511 / 16) + 2) + 8,192 / 16 = 784 blocks of 16 × 22,528 B =
// 282,591,232 B on every rank (each holds the one KV head), the global pool
// the rest at 4,096 B per token: rank 0's usable 36,122,177,894 B less the
// local pool is 546,868 blocks of 65,536 B, which bind the replica.
TEST_F(PlanCli, Gemma3SaysWhatItsSlidingLayersKeep) {
  Result r = run("plan gemma-3-1b --gpus 3xA100-40GB");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "Gemma3ForCausalLM, 26 layers, 4 Q / 1 KV heads × 256")) << r.out;
  EXPECT_TRUE(has(r.out, "KV cache: 26,624 bytes per token")) << r.out;
  EXPECT_TRUE(has(r.out, "Sliding window: 22 of 26 layers attend to the last 512 positions")) << r.out;
  EXPECT_TRUE(has(r.out, "KV per layer type: 4 global layers 4,096 bytes per token of context; 22 local layers "
                         "22,528 bytes per token, over at most 8,703 tokens per sequence")) << r.out;
  EXPECT_TRUE(has(r.out, "A sequence of 32,768 tokens needs 330,278,912 bytes")) << r.out;
  EXPECT_TRUE(has(r.out, "the local layers keep their KV in a pool of their own whose blocks leave the window: at "
                         "most 784 blocks of 16 per rank (8 sequences × (ceil((512 - 1) / 16) + 2) + ceil(8,192 / 16)), "
                         "282,591,232 bytes on one device")) << r.out;
  EXPECT_TRUE(has(r.out, "KV capacity per rank (blocks of 16 tokens): 546,868, 547,593, 547,593")) << r.out;
  EXPECT_TRUE(has(r.out, "Total number of attention heads (4) must be divisible by tensor parallel size (3).")) << r.out;
  EXPECT_TRUE(has(r.out, "vllm serve google/gemma-3-1b-it")) << r.out;
  Result j = run("plan gemma-3-1b --gpus 3xA100-40GB --json");
  ASSERT_EQ(j.rc, 0) << j.err;
  const nlohmann::json t = nlohmann::json::parse(j.out)["model"]["kv_layer_types"];
  EXPECT_EQ(t["n_global_layers"], 4);
  EXPECT_EQ(t["n_local_layers"], 22);
  EXPECT_EQ(t["sliding_window"], 512);
  EXPECT_EQ(t["global_bytes_per_token"], 4096);
  EXPECT_EQ(t["local_bytes_per_token"], 22528);
  EXPECT_EQ(t["cache_sliding_window"], 0);  // the global layers keep every block of their pool
  EXPECT_EQ(t["local_pool_window"], 512);
  EXPECT_EQ(t["local_pool_blocks"], 784);
  const nlohmann::json rec = nlohmann::json::parse(j.out)["recommended"];
  ASSERT_EQ(rec["tp"], 3);
  ASSERT_EQ(rec["budgets"][0].size(), 3u);
  for (const nlohmann::json& b : rec["budgets"][0]) {
    EXPECT_EQ(b["kv_bytes_per_token"], 4096);
    EXPECT_EQ(b["local_kv_bytes_per_token"], 22528);
    EXPECT_EQ(b["n_local_kv_blocks_max"], 784);
    EXPECT_EQ(b["n_local_kv_blocks"], 784);  // far below the 84,797 blocks both pools could have alike
    EXPECT_EQ(b["local_kv_block_bytes"], 360448);
    EXPECT_EQ(b["local_kv_cache_bytes"], 282591232);
    EXPECT_EQ(b["n_kv_blocks"], 546868);
    EXPECT_EQ(b["kv_cache_bytes"], int64_t{546868} * 65536 + 282591232);  // 36,122,132,480
  }
  EXPECT_EQ(rec["budgets"][0][0]["n_kv_blocks_capacity"], 546868);  // rank 0 binds: more weights
  EXPECT_EQ(rec["budgets"][0][1]["n_kv_blocks_capacity"], 547593);
}

// Phi-3-mini-4k slides on every layer (window 2,047): the cache releases the
// blocks that leave it, so a sequence of 4,096 tokens holds ceil((2,046 + 512)
// / 16) + 1 = 161 blocks, and more full-length sequences fit.
TEST_F(PlanCli, EveryLayerSlidingCountsOnlyTheWindow) {
  Result wide = run("plan phi-3-mini-4k --gpus 1xA100-40GB --max-num-batched-tokens 8192");
  Result r = run("plan phi-3-mini-4k --gpus 1xA100-40GB --max-num-batched-tokens 512");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  ASSERT_EQ(wide.rc, 0) << wide.out << wide.err;
  EXPECT_TRUE(has(r.out, "Sliding window: 32 of 32 layers attend to the last 2,047 positions")) << r.out;
  EXPECT_TRUE(has(r.out, "the cache releases the blocks that leave the window, so it holds at most 2,576 tokens"))
      << r.out;
  EXPECT_TRUE(has(r.out, "max-model-len 4,096, 29 full-length sequences per replica")) << r.out;
  // A chunk of 8,192 covers the whole context: nothing is released within one sequence of 4,096.
  EXPECT_TRUE(has(wide.out, "so it holds at most 4,096 tokens")) << wide.out;
  EXPECT_TRUE(has(wide.out, "max-model-len 4,096, 17 full-length sequences per replica")) << wide.out;
}

TEST_F(PlanCli, JsonIsTheFullPlan) {
  Result r = run("plan qwen2.5-7b --gpus 6xA100-40GB --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["recommended"]["tp"], 6);
  // Hand-computed in memory_budget_test: rank 0 at TP6 holds 2,579,562,496 bytes, 14,336 KV B/token.
  EXPECT_EQ(j["recommended"]["budgets"][0][0]["weight_bytes"].get<int64_t>(), 2579562496LL);
  EXPECT_EQ(j["recommended"]["budgets"][0][0]["kv_bytes_per_token"].get<int64_t>(), 14336);
  EXPECT_EQ(j["recommended"]["budgets"][0][0]["n_kv_blocks_capacity"].get<int64_t>(), 148100);
  // The tightest rank is rank 1 (2 KV heads, the most weights; workspace 639,049,728 with its
  // attention 8192·(10+4)·128·4): usable = 38,254,569,062 − 2,630,957,056 − 639,049,728 − 1,073,741,824
  // = 33,910,820,454; / (28,672 · 16 = 458,752) = 73,919 blocks = 1,182,704 tokens, and every rank
  // of the replica allocates that many.
  for (int r = 0; r < 6; ++r)
    EXPECT_EQ(j["recommended"]["budgets"][0][r]["n_kv_tokens"].get<int64_t>(), 1182704) << r;
  EXPECT_EQ(j["recommended"]["kv_tokens_per_replica"].get<int64_t>(), 1182704);
  EXPECT_EQ(j["layouts"].size(), 25u);
  EXPECT_EQ(j["model"]["official_total_bytes"].get<int64_t>(), 15231233024LL);
  EXPECT_EQ(j["fits"], true);
}

TEST_F(PlanCli, DtypeAndKvDtypeChangeTheBytes) {
  // --dtype f32 doubles every weight: 2 × 15,231,233,024 = 30,462,466,048; the KV cache follows the
  // weights under auto: 2 × 4 × 128 × 4 × 28 = 114,688 B/token; fp8 KV: 2 × 4 × 128 × 1 × 28 = 28,672.
  Result f32 = run("plan qwen2.5-7b --gpus 2xH100-80GB --dtype f32 --json");
  ASSERT_EQ(f32.rc, 0) << f32.err;
  nlohmann::json j = nlohmann::json::parse(f32.out);
  EXPECT_EQ(j["model"]["weight_bytes"].get<int64_t>(), 30462466048LL);
  EXPECT_EQ(j["model"]["kv_bytes_per_token"].get<int64_t>(), 114688);
  Result fp8 = run("plan qwen2.5-7b --gpus 2xH100-80GB --kv-cache-dtype fp8 --json");
  ASSERT_EQ(fp8.rc, 0) << fp8.err;
  j = nlohmann::json::parse(fp8.out);
  EXPECT_EQ(j["model"]["kv_bytes_per_token"].get<int64_t>(), 28672);
  EXPECT_TRUE(has(j["recommended"]["vllm_command"].get<std::string>(), "--kv-cache-dtype fp8"));
}

TEST_F(PlanCli, Qwen72bOnSix24GiBCardsExitsOneWithTheArithmetic) {
  Result r = run("plan qwen2.5-72b --gpus 6x24GiB");
  EXPECT_EQ(r.rc, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "Nothing fits")) << r.out;
  EXPECT_TRUE(has(r.out, "145,412,407,296 bytes (145.4 GB = 135.43 GiB)")) << r.out;
  EXPECT_TRUE(has(r.out, "8 × 24GiB would fit")) << r.out;
  Result j = run("plan qwen2.5-72b --gpus 6x24GiB --json");
  EXPECT_EQ(j.rc, 1);
  nlohmann::json plan = nlohmann::json::parse(j.out);
  EXPECT_EQ(plan["fits"], false);
  EXPECT_TRUE(plan["recommended"].is_null());
}

TEST_F(PlanCli, Qwen14bAtTp5IsMarkedAsRefusedByVllm) {
  Result r = run("plan qwen2.5-14b --gpus 5xH100-80GB --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  bool seen = false;
  for (const auto& l : j["layouts"])
    if (l["tp"] == 5 && l["pp"] == 1 && l["dp"] == 1) {
      seen = true;
      EXPECT_EQ(l["vllm"]["accepted"], false);
      EXPECT_EQ(l["vllm"]["reason"], "AssertionError: assert self.total_num_kv_heads % tp_size == 0");
      EXPECT_EQ(l["vllm"]["rule"], "8 KV heads % TP 5 = 3, not 0");
      EXPECT_EQ(l["vllm_command"], "");
      EXPECT_TRUE(l["fits"].get<bool>());
    }
  EXPECT_TRUE(seen);
}

TEST_F(PlanCli, ExitCodes) {
  Result unknown = run("plan no-such-model --gpus 2xH100");
  EXPECT_EQ(unknown.rc, 1);
  EXPECT_TRUE(has(unknown.err, "qwen2.5-7b")) << unknown.err;  // the catalog is listed
  Result bad_gpu = run("plan qwen2.5-7b --gpus 6xB300");
  EXPECT_EQ(bad_gpu.rc, 2);
  EXPECT_TRUE(has(bad_gpu.err, "unknown device \"B300\"")) << bad_gpu.err;
  Result too_long = run("plan qwen2.5-7b --gpus 1xH100 --max-model-len 100000");
  EXPECT_EQ(too_long.rc, 2);
  EXPECT_TRUE(has(too_long.err, "max_position_embeddings")) << too_long.err;
  Result bad_util = run("plan qwen2.5-7b --gpus 1xH100 --gpu-memory-utilization 1.5");
  EXPECT_EQ(bad_util.rc, 2);
  Result bad_obj = run("plan qwen2.5-7b --gpus 1xH100 --objective fastest");
  EXPECT_EQ(bad_obj.rc, 2);
  Result bad_kv = run("plan qwen2.5-7b --gpus 1xH100 --kv-cache-dtype int4");
  EXPECT_EQ(bad_kv.rc, 2);
  Result nodes = run("plan qwen2.5-7b --gpus 3xH100 --nodes 2");
  EXPECT_EQ(nodes.rc, 2);
}

TEST_F(PlanCli, ModelDirectoryIsSizedFromItsSafetensorsHeaders) {
  write_tiny_model(dir_ / "tiny");
  // By hand: embed 256·64 = 16,384; per layer norms 128 + q 4,096 + 64 + k,v 2·(2,048 + 32)
  // + o 4,096 + MLP 3·128·64 = 24,576 → 37,120; × 2 layers = 74,240; norm 64; lm_head 16,384.
  // 107,072 elements × 2 bytes = 214,144 bytes.
  Result r = run("plan '" + (dir_ / "tiny").string() + "' --gpus 2x1GiB --reserve-gib 0 --max-num-batched-tokens 256 --json");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["checkpoint"]["total_bytes"].get<int64_t>(), 214144);
  EXPECT_EQ(j["checkpoint"]["files"], 2);
  EXPECT_EQ(j["model"]["weight_bytes"].get<int64_t>(), 214144);
  // KV per token: 2 × 2 KV heads × 16 × 2 bytes × 2 layers = 256.
  EXPECT_EQ(j["model"]["kv_bytes_per_token"].get<int64_t>(), 256);
  // A config.json path works too.
  Result c = run("plan '" + (dir_ / "tiny" / "config.json").string() + "' --gpus 1x1GiB --reserve-gib 0 --max-num-batched-tokens 256");
  EXPECT_EQ(c.rc, 0) << c.err;
  EXPECT_TRUE(has(c.out, "Checkpoint: 2 .safetensors file(s), 27 tensors, 214,144 bytes")) << c.out;
}

TEST_F(PlanCli, BrokenCheckpointsAreNamed) {
  write_tiny_model(dir_ / "badshape", /*bad_q_shape=*/true);
  Result r = run("plan '" + (dir_ / "badshape").string() + "' --gpus 1x1GiB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "model.layers.0.self_attn.q_proj.weight has shape [60, 64] but config.json implies [64, 64]"))
      << r.err;

  write_tiny_model(dir_ / "truncated");
  fs::resize_file(dir_ / "truncated" / "model-00002-of-00002.safetensors", 100);
  r = run("plan '" + (dir_ / "truncated").string() + "' --gpus 1x1GiB");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(has(r.err, "model-00002-of-00002.safetensors")) << r.err;
  EXPECT_TRUE(has(r.err, "truncated")) << r.err;
}

// --speculative-config: a draft model's weights, step buffers and KV cache
// are their own lines and JSON fields on the replica's rank 0 and in its fit;
// n-gram adds only the verification rows. By hand, for the tiny target above
// and a one-layer draft of it on 1 GiB × 0.9 = 966,367,641 B, no reserve,
// T = 256 batched tokens, S = 8 sequences, k = 4:
//  - draft weights: embed 16,384 + one layer 37,120 + norm 64 + lm_head 16,384
//    = 69,952 elements × 2 = 139,904 B;
//  - draft workspace: hidden 3·256·64·4 = 196,608, attention 256·(8 + 4)·16·4
//    = 196,608, MLP 2·256·128·4 = 262,144, logits 8·64·4 + 8·256·4 = 10,240,
//    and the host copy of its 8 logits rows 8·256·4 = 8,192: 673,792 B;
//  - draft KV: 2 × 2 heads × 16 × 2 B × 1 layer = 128 B/token, 2,048 B a block;
//  - the target's workspace asks 5 logits rows per sequence: 40·64·4 + 40·256·4
//    = 51,200 for logits, + 16,384 sampler + the 655,360 above = 722,944 B;
//  - usable: 966,367,641 − 214,144 − 722,944 − (139,904 + 673,792 + 2,048 spare)
//    = 964,614,809; blocks of 4,096 + 2,048 B: 157,001 for the target,
//    157,002 for the draft = 321,540,096 B.
TEST_F(PlanCli, SpeculativeConfigCountsTheDraftOnRankZero) {
  write_tiny_model(dir_ / "tiny");
  write_tiny_model(dir_ / "draft", false, 1);
  const std::string base = "plan '" + (dir_ / "tiny").string() +
                           "' --gpus 1x1GiB --reserve-gib 0 --max-num-batched-tokens 256 --max-num-seqs 8";
  const std::string cfg = R"( --speculative-config '{"model":")" + (dir_ / "draft").string() +
                          R"(","num_speculative_tokens":4}')";
  Result j = run(base + cfg + " --json");
  ASSERT_EQ(j.rc, 0) << j.out << j.err;
  nlohmann::json plan = nlohmann::json::parse(j.out);
  const nlohmann::json& rank0 = plan["recommended"]["budgets"][0][0];
  EXPECT_EQ(rank0["draft"]["weight_bytes"].get<int64_t>(), 139904) << rank0.dump();
  EXPECT_EQ(rank0["draft"]["workspace_bytes"].get<int64_t>(), 673792);
  EXPECT_EQ(rank0["draft"]["kv_bytes_per_token"].get<int64_t>(), 128);
  EXPECT_EQ(rank0["workspace_bytes"].get<int64_t>(), 722944);
  EXPECT_EQ(rank0["usable_bytes"].get<int64_t>(), 964614809);
  EXPECT_EQ(rank0["n_kv_blocks"].get<int64_t>(), 157001);
  EXPECT_EQ(rank0["draft"]["n_kv_blocks"].get<int64_t>(), 157002);
  EXPECT_EQ(rank0["draft"]["kv_cache_bytes"].get<int64_t>(), 321540096);
  EXPECT_EQ(plan["options"]["speculative"]["method"], "draft_model");
  EXPECT_EQ(plan["options"]["speculative"]["logit_rows_per_seq"], 5);
  EXPECT_TRUE(has(plan["recommended"]["shardlm_command"].get<std::string>(), "--speculative-config '{\"model\""))
      << plan["recommended"].dump();

  Result t = run(base + cfg);
  ASSERT_EQ(t.rc, 0) << t.out << t.err;
  EXPECT_TRUE(has(t.out, "draft model " + (dir_ / "draft").string() + " (TP 1, PP 1) beside replica 0's driver, "
                  "device 0 (1GiB): weights 139,904 B, workspace 673,792 B, KV cache 321,540,096 B (157,002 blocks "
                  "of 16 tokens: the replica's 157,001 and a spare; 128 B/token)")) << t.out;
  EXPECT_TRUE(has(t.out, "verification steps ask 5 logits rows per sequence")) << t.out;

  // Prompt lookup: no draft; the target's blocks take all of usable.
  Result n = run(base + R"( --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}' --json)");
  ASSERT_EQ(n.rc, 0) << n.out << n.err;
  plan = nlohmann::json::parse(n.out);
  EXPECT_TRUE(plan["recommended"]["budgets"][0][0]["draft"].is_null());
  EXPECT_EQ(plan["recommended"]["budgets"][0][0]["n_kv_blocks"].get<int64_t>(), (966367641 - 214144 - 722944) / 4096);
  Result nt = run(base + R"( --speculative-config '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}')");
  EXPECT_TRUE(has(nt.out, "speculative decoding (ngram, 4 tokens): no weights or KV cache of its own")) << nt.out;

  // A draft too big for the device: nothing fits, exit 1.
  Result small = run("plan '" + (dir_ / "tiny").string() + "' --gpus 1x2MiB --reserve-gib 0 --max-num-batched-tokens 256" +
                     cfg);
  EXPECT_EQ(small.rc, 1) << small.out;
  Result small_alone = run("plan '" + (dir_ / "tiny").string() + "' --gpus 1x2MiB --reserve-gib 0 --max-num-batched-tokens 256");
  EXPECT_EQ(small_alone.rc, 0) << small_alone.out;
}

TEST_F(PlanCli, SpeculativeConfigRefusesABadDraftNamingIt) {
  write_tiny_model(dir_ / "tiny");
  fs::create_directories(dir_ / "empty");
  Result none = run("plan '" + (dir_ / "tiny").string() + R"(' --gpus 1x1GiB --speculative-config '{"model":")" +
                    (dir_ / "empty").string() + R"(","num_speculative_tokens":4}')");
  EXPECT_NE(none.rc, 0);
  EXPECT_TRUE(has(none.err, (dir_ / "empty" / "config.json").string() + " not found")) << none.err;
  write_tiny_model(dir_ / "vocab512", false, 1, 512);
  Result vocab = run("plan '" + (dir_ / "tiny").string() + R"(' --gpus 1x1GiB --speculative-config '{"model":")" +
                     (dir_ / "vocab512").string() + R"(","num_speculative_tokens":4}')");
  EXPECT_NE(vocab.rc, 0);
  EXPECT_TRUE(has(vocab.err, "the draft's vocab_size 512 is not the target's 256")) << vocab.err;
  Result bad = run("plan '" + (dir_ / "tiny").string() + R"(' --gpus 1x1GiB --speculative-config '{"model":")" +
                   (dir_ / "tiny").string() + R"(","num_speculative_tokens":4,"prompt_lookup_max":2}')");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(has(bad.err, "\"prompt_lookup_max\" is a key of method ngram")) << bad.err;
}

}  // namespace
