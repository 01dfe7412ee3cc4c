// Model directories: single file and sharded, index against shards, and the
// checkpoint against config.json. Tensor counts and shapes below are worked
// out by hand from kTinyConfig: 27 tensors, 9 per shard when split in 3.
#include "loader/checkpoint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_files.h"

namespace shardlm {
namespace {

using testing::kTinyConfig;
using testing::shard_name;
using testing::TinyModelOptions;
using testing::write_tiny_model;

ModelSpec tiny_spec() { return parse_model_config(nlohmann::json::parse(kTinyConfig), "config.json"); }

std::string problems_text(const std::vector<Problem>& problems) {
  std::string out;
  for (const Problem& p : problems) out += "  " + p.text() + "\n";
  return out;
}

TEST(Checkpoint, SingleFileOpensAndMatchesConfig) {
  auto dir = testing::fresh_dir("ckpt_single");
  write_tiny_model(dir, kTinyConfig);
  Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_FALSE(ckpt.sharded());
  EXPECT_EQ(ckpt.weight_file_names(), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_TRUE(ckpt.problems().empty()) << problems_text(ckpt.problems());
  EXPECT_EQ(ckpt.n_tensors(), 27u);
  // bytes: embed+lm_head 2*32*16, q,o 2*16*16, k,v 2*8*16, biases 16+8+8, norms 2*16,
  // gate,up,down 3*32*16 per layer; final norm 16. In bf16 (x2):
  // 2*(1024 + 2*(512 + 256 + 32 + 32 + 1536) + 16) = 2*5776 = 11552.
  EXPECT_EQ(ckpt.tensor_bytes(), 11552u);
  const TensorView& k = ckpt.at("model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(k.shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(k.dtype, DType::kBF16);
  EXPECT_EQ(load_as_f32(k.data, k.dtype, 127), 1.0f);
  EXPECT_EQ(ckpt.file_of("model.norm.weight")->name(), "model.safetensors");
  ASSERT_TRUE(ckpt.config_json().has_value());
  ASSERT_TRUE(ckpt.tokenizer_json().has_value());
  EXPECT_FALSE(ckpt.generation_config_json().has_value());
  EXPECT_TRUE(validate_against_spec(ckpt, tiny_spec()).empty());
  try {
    (void)ckpt.at("model.layers.2.self_attn.k_proj.weight");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_EQ(std::string(e.what()),
              dir.string() + ": the checkpoint has no tensor model.layers.2.self_attn.k_proj.weight");
  }
}

TEST(Checkpoint, ShardedOpensAcrossFiles) {
  auto dir = testing::fresh_dir("ckpt_sharded");
  auto names = write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  ASSERT_EQ(names[1][0], "model.layers.0.post_attention_layernorm.weight");
  Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_TRUE(ckpt.sharded());
  EXPECT_TRUE(ckpt.problems().empty()) << problems_text(ckpt.problems());
  EXPECT_EQ(ckpt.weight_file_names(),
            (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors"}));
  EXPECT_EQ(ckpt.files().size(), 3u);
  EXPECT_EQ(ckpt.n_tensors(), 27u);
  EXPECT_EQ(ckpt.file_of("model.embed_tokens.weight")->name(), "model-00001-of-00003.safetensors");
  EXPECT_EQ(ckpt.file_of("model.layers.0.mlp.down_proj.weight")->name(), "model-00002-of-00003.safetensors");
  EXPECT_EQ(ckpt.file_of("lm_head.weight")->name(), "model-00003-of-00003.safetensors");
  EXPECT_TRUE(validate_against_spec(ckpt, tiny_spec()).empty());
}

TEST(Checkpoint, DeletedShardIsNamedWithItsTensorCount) {
  auto dir = testing::fresh_dir("ckpt_deleted_shard");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  std::filesystem::remove(dir / "model-00002-of-00003.safetensors");
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 1u) << problems_text(ckpt.problems());
  const Problem& p = ckpt.problems()[0];
  EXPECT_EQ(p.file, "model-00002-of-00003.safetensors");
  EXPECT_EQ(p.code, ErrorCode::kNotFound);
  EXPECT_EQ(p.text(),
            "model-00002-of-00003.safetensors: missing: model.safetensors.index.json puts 9 tensors in this file; "
            "download this file");
  EXPECT_EQ(ckpt.n_tensors(), 18u);
  // The tensors of the missing shard are not reported again as missing.
  EXPECT_TRUE(validate_against_spec(ckpt, tiny_spec()).empty());
  try {
    (void)Checkpoint::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), p.text());
  }
}

TEST(Checkpoint, RenamedTensorInShard) {
  auto dir = testing::fresh_dir("ckpt_renamed");
  write_tiny_model(dir, kTinyConfig,
                   {.n_shards = 3, .rename = {{"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up.weight"}}});
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 2u) << problems_text(ckpt.problems());
  EXPECT_EQ(ckpt.problems()[0].text(),
            "model-00002-of-00003.safetensors: model.safetensors.index.json puts tensor "
            "model.layers.0.mlp.up_proj.weight in this file, but the file does not have it; the index and the "
            "shards come from different downloads; download the model again");
  EXPECT_EQ(ckpt.problems()[1].tensor, "model.layers.0.mlp.up.weight");
  EXPECT_EQ(ckpt.problems()[1].message,
            "tensor model.layers.0.mlp.up.weight is in this file but model.safetensors.index.json does not list it");
  // Against config.json: the renamed tensor is unexpected; the original is named by the index, so not "missing".
  std::vector<Problem> spec_problems = validate_against_spec(ckpt, tiny_spec());
  ASSERT_EQ(spec_problems.size(), 1u) << problems_text(spec_problems);
  EXPECT_EQ(spec_problems[0].message,
            "tensor model.layers.0.mlp.up.weight is not part of a Qwen2ForCausalLM with 2 layers as config.json "
            "describes it");
}

TEST(Checkpoint, IndexNamingAMissingFile) {
  auto dir = testing::fresh_dir("ckpt_index_missing_file");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  auto index = nlohmann::json::parse(testing::read_text(dir / "model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "model-00004-of-00003.safetensors";
  testing::write_text(dir / "model.safetensors.index.json", index.dump());
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 1u) << problems_text(ckpt.problems());
  EXPECT_EQ(ckpt.problems()[0].text(),
            "model-00004-of-00003.safetensors: missing: model.safetensors.index.json puts 1 tensor in this file; "
            "download this file");
}

TEST(Checkpoint, TensorInTwoShards) {
  auto dir = testing::fresh_dir("ckpt_duplicate");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3, .extra = {testing::bf16_tensor("model.embed_tokens.weight", {32, 16})}});
  // The extra copy went to shard 3 and the index now says shard 3 for it; shard 1 has it too.
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 1u) << problems_text(ckpt.problems());
  EXPECT_EQ(ckpt.problems()[0].file, "model-00003-of-00003.safetensors");
  EXPECT_EQ(ckpt.problems()[0].message,
            "tensor model.embed_tokens.weight is also in model-00001-of-00003.safetensors; a tensor must be in "
            "exactly one file");
}

TEST(Checkpoint, TruncatedShardKeepsTheOthersUsable) {
  auto dir = testing::fresh_dir("ckpt_truncated");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  auto path = dir / "model-00003-of-00003.safetensors";
  auto bytes = testing::read_bytes(path);
  size_t full = bytes.size();
  bytes.resize(full - 100);  // cuts into lm_head [32, 16] bf16, the last tensor (1,024 bytes)
  testing::write_bytes(path, bytes);
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 1u) << problems_text(ckpt.problems());
  const Problem& p = ckpt.problems()[0];
  EXPECT_EQ(p.file, "model-00003-of-00003.safetensors");
  EXPECT_EQ(p.tensor, "lm_head.weight");
  // Shard 3: k/v biases 2*16, o_proj 512, post norm 32, gate/up/down 3*1,024, norm 32, lm_head 1,024
  // = 4,704 data bytes, after an 832-byte header and the 8-byte length.
  ASSERT_EQ(full, 5544u);
  EXPECT_EQ(p.message,
            "5,444 of 5,544 bytes — the download was cut (1 tensor ends past the end of the file, the first is "
            "lm_head.weight)");
  EXPECT_EQ(ckpt.n_tensors(), 26u);
  EXPECT_EQ(ckpt.find("lm_head.weight"), nullptr);
  EXPECT_TRUE(validate_against_spec(ckpt, tiny_spec()).empty());
}

TEST(Checkpoint, OpenReportsHowManyMoreProblems) {
  auto dir = testing::fresh_dir("ckpt_many");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  std::filesystem::remove(dir / "model-00001-of-00003.safetensors");
  std::filesystem::remove(dir / "model-00003-of-00003.safetensors");
  try {
    (void)Checkpoint::open(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "model-00001-of-00003.safetensors: missing: model.safetensors.index.json puts 9 tensors in this "
              "file; download this file (and 1 more problem; run `shardlm verify " + dir.string() +
                  "` to list them)");
  }
}

TEST(Checkpoint, NoWeightsAtAll) {
  auto dir = testing::fresh_dir("ckpt_no_weights");
  testing::write_text(dir / "config.json", kTinyConfig);
  testing::write_text(dir / "pytorch_model.bin", "x");
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 1u);
  EXPECT_EQ(ckpt.problems()[0].text(),
            "model.safetensors: missing: the directory has neither model.safetensors nor "
            "model.safetensors.index.json (it has PyTorch .bin/.pth weights, which shardlm does not read); "
            "download the model's .safetensors files (and model.safetensors.index.json if sharded)");
}

TEST(Checkpoint, ShardsWithoutIndex) {
  auto dir = testing::fresh_dir("ckpt_no_index");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2});
  std::filesystem::remove(dir / "model.safetensors.index.json");
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 1u);
  EXPECT_EQ(ckpt.problems()[0].text(),
            "model.safetensors.index.json: missing: the directory has 2 shards (model-00001-of-00002.safetensors, "
            "...) but no index saying which tensor is in which; download model.safetensors.index.json");
}

TEST(Checkpoint, BrokenIndexStillChecksShards) {
  auto dir = testing::fresh_dir("ckpt_broken_index");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2});
  testing::write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
  auto path = dir / "model-00002-of-00002.safetensors";
  auto bytes = testing::read_bytes(path);
  bytes.resize(4);
  testing::write_bytes(path, bytes);
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_EQ(ckpt.problems().size(), 2u) << problems_text(ckpt.problems());
  EXPECT_EQ(ckpt.problems()[0].text(),
            "model.safetensors.index.json: has no \"weight_map\" object mapping tensor names to shard files; "
            "download model.safetensors.index.json again");
  EXPECT_EQ(ckpt.problems()[1].file, "model-00002-of-00002.safetensors");
  EXPECT_EQ(ckpt.problems()[1].message.substr(0, 12), "only 4 bytes");
}

TEST(Checkpoint, IndexEntryOutsideTheDirectoryIsRefused) {
  auto dir = testing::fresh_dir("ckpt_index_escape");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2});
  auto index = nlohmann::json::parse(testing::read_text(dir / "model.safetensors.index.json"));
  index["weight_map"]["model.norm.weight"] = "../model-00002-of-00002.safetensors";
  testing::write_text(dir / "model.safetensors.index.json", index.dump());
  Checkpoint ckpt = Checkpoint::inspect(dir);
  ASSERT_GE(ckpt.problems().size(), 1u);
  EXPECT_EQ(ckpt.problems()[0].message,
            "weight_map entry for tensor model.norm.weight is \"../model-00002-of-00002.safetensors\", expected the "
            "name of a .safetensors file in the model directory");
}

// --- against config.json -----------------------------------------------------

TEST(CheckpointSpec, WrongShapeNamesTheConfigFields) {
  auto dir = testing::fresh_dir("spec_shape");
  write_tiny_model(dir, kTinyConfig,
                   {.n_shards = 2, .reshape = {{"model.layers.1.self_attn.k_proj.weight", {4, 16}}}});
  Checkpoint ckpt = Checkpoint::open(dir);
  std::vector<Problem> problems = validate_against_spec(ckpt, tiny_spec());
  ASSERT_EQ(problems.size(), 1u) << problems_text(problems);
  EXPECT_EQ(problems[0].file, "model-00002-of-00002.safetensors");
  EXPECT_EQ(problems[0].tensor, "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(problems[0].message,
            "tensor model.layers.1.self_attn.k_proj.weight has shape [4, 16], config.json implies [8, 16] "
            "(num_key_value_heads=2, head_dim=4)");
  try {
    require_matches_spec(ckpt, tiny_spec());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), problems[0].text());
  }
}

TEST(CheckpointSpec, ConfigFromAnotherModel) {
  // Weights with 2 KV heads, a config.json saying 4: k/v weights and biases of both layers differ.
  auto dir = testing::fresh_dir("spec_other_config");
  write_tiny_model(dir, kTinyConfig);
  std::string other = kTinyConfig;
  other.replace(other.find("\"num_key_value_heads\": 2"), 24, "\"num_key_value_heads\": 4");
  ModelSpec spec = parse_model_config(nlohmann::json::parse(other), "config.json");
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), spec);
  ASSERT_EQ(problems.size(), 8u) << problems_text(problems);
  EXPECT_EQ(problems[0].message,
            "tensor model.layers.0.self_attn.k_proj.weight has shape [8, 16], config.json implies [16, 16] "
            "(num_key_value_heads=4, head_dim=4)");
  EXPECT_EQ(problems[3].message,
            "tensor model.layers.0.self_attn.v_proj.bias has shape [8], config.json implies [16] "
            "(num_key_value_heads=4, head_dim=4)");
  EXPECT_EQ(problems[0].fix,
            "the weights and config.json do not belong together; use the config.json that came with these weights "
            "(or download the model again)");
}

TEST(CheckpointSpec, MissingAndUnexpectedTensors) {
  auto dir = testing::fresh_dir("spec_missing");
  write_tiny_model(dir, kTinyConfig,
                   {.drop = {"model.norm.weight", "lm_head.weight"},
                    .extra = {testing::bf16_tensor("model.layers.0.mlp.gate_proj.bias", {32}),
                              testing::f32_tensor("model.layers.0.self_attn.rotary_emb.inv_freq", {2})}});
  Checkpoint ckpt = Checkpoint::open(dir);
  std::vector<Problem> problems = validate_against_spec(ckpt, tiny_spec());
  ASSERT_EQ(problems.size(), 3u) << problems_text(problems);
  EXPECT_EQ(problems[0].text().substr(0, problems[0].text().find(';', 60)),
            "model.safetensors: tensor model.norm.weight is missing; config.json (Qwen2ForCausalLM with 2 layers) "
            "requires it");
  EXPECT_EQ(problems[1].message,
            "tensor lm_head.weight is missing; config.json has tie_word_embeddings=false, so the model needs its "
            "own lm_head");
  EXPECT_EQ(problems[2].message,
            "tensor model.layers.0.mlp.gate_proj.bias is not part of a Qwen2ForCausalLM with 2 layers as "
            "config.json describes it");
  // inv_freq is F32 among BF16 but is ignored entirely.
}

TEST(CheckpointSpec, TiedModelMayOmitOrShipLmHead) {
  std::string tied = kTinyConfig;
  tied.replace(tied.find("\"tie_word_embeddings\": false"), 28, "\"tie_word_embeddings\": true ");
  ModelSpec spec = parse_model_config(nlohmann::json::parse(tied), "config.json");
  auto dir = testing::fresh_dir("spec_tied");
  write_tiny_model(dir, tied);  // writes no lm_head: optional tensors are skipped
  Checkpoint without = Checkpoint::open(dir);
  EXPECT_EQ(without.find("lm_head.weight"), nullptr);
  EXPECT_TRUE(validate_against_spec(without, spec).empty());
  auto dir2 = testing::fresh_dir("spec_tied_with_head");
  write_tiny_model(dir2, tied, {.extra = {testing::bf16_tensor("lm_head.weight", {32, 16})}});
  EXPECT_TRUE(validate_against_spec(Checkpoint::open(dir2), spec).empty());
}

TEST(CheckpointSpec, MixedDtypes) {
  auto dir = testing::fresh_dir("spec_mixed");
  write_tiny_model(dir, kTinyConfig, {.f32 = {{"model.norm.weight", ""}}});
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), tiny_spec());
  ASSERT_EQ(problems.size(), 1u) << problems_text(problems);
  EXPECT_EQ(problems[0].code, ErrorCode::kUnsupported);
  EXPECT_EQ(problems[0].message,
            "tensor model.norm.weight is F32 but 26 other tensors are BF16; shardlm needs one dtype per checkpoint");
}

TEST(CheckpointSpec, ManyMissingTensorsAreSummarised) {
  // config.json says 5 layers; the weights have 2: layers 2..4 are missing, 12 tensors each.
  std::string five = kTinyConfig;
  five.replace(five.find("\"num_hidden_layers\": 2"), 22, "\"num_hidden_layers\": 5");
  ModelSpec spec = parse_model_config(nlohmann::json::parse(five), "config.json");
  auto dir = testing::fresh_dir("spec_layers");
  write_tiny_model(dir, kTinyConfig);
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), spec);
  ASSERT_EQ(problems.size(), 21u);
  EXPECT_EQ(problems[0].tensor, "model.layers.2.input_layernorm.weight");
  EXPECT_EQ(problems[20].message,
            "and 16 more tensors are missing (36 in all; config.json describes Qwen2ForCausalLM with 5 layers)");
}

}  // namespace
}  // namespace shardlm

#include "loader/generation_config.h"

namespace shardlm {
namespace {

TEST(GenerationConfig, SamplingDefaultsAsVllmReadsThem) {
  auto dir = testing::fresh_dir("generation_defaults");
  EXPECT_FALSE(load_generation_defaults(dir).temperature);  // no file: nothing set
  testing::write_text(dir / "generation_config.json",
             R"({"do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05,
                 "max_new_tokens": 512, "eos_token_id": [1, 2]})");
  GenerationDefaults d = load_generation_defaults(dir);
  EXPECT_DOUBLE_EQ(*d.temperature, 0.6);
  EXPECT_DOUBLE_EQ(*d.top_p, 0.95);
  EXPECT_EQ(*d.top_k, 20);
  EXPECT_FALSE(d.min_p);
  EXPECT_DOUBLE_EQ(*d.repetition_penalty, 1.05);
  EXPECT_EQ(*d.max_new_tokens, 512);
  testing::write_text(dir / "generation_config.json", R"({"top_k": "twenty"})");
  try {
    load_generation_defaults(dir);
    FAIL() << "a string top_k was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_k must be an integer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
