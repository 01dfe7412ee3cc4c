// `shardlm verify` end to end: runs the binary on model directories broken in
// known ways and checks exit codes, every problem line, --json and --sha256
// (against the system's sha256sum).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/process.h"
#include "test_files.h"

namespace shardlm {
namespace {

using testing::kTinyConfig;
using testing::write_tiny_model;

struct CliRun {
  int status;
  std::string out, err;
};

CliRun verify(const std::string& args) {
  const auto c = testing::run_command(testing::shell_quote(testing::cli_path()) + " verify " + args);
  return {c.rc, c.out, c.err};
}

std::string q(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

TEST(VerifyCli, HealthyShardedModelIsOk) {
  auto dir = testing::fresh_dir("verify_ok");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  CliRun r = verify(q(dir));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // config, index, 3 shards, tokenizer.json, tokenizer_config.json; 27 tensors of 11,552 bytes.
  EXPECT_EQ(r.out, "OK: " + dir.string() +
                       ": 7 files, 27 tensors, 11,552 bytes of weights (0.00 GiB); Qwen2ForCausalLM, 2 layers\n");
}

TEST(VerifyCli, ListsEveryProblem) {
  auto dir = testing::fresh_dir("verify_broken");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 3});
  // Cut shard 3 by 100 bytes (lm_head is its last tensor), delete shard 2, break tokenizer.json.
  auto path = dir / "model-00003-of-00003.safetensors";
  auto bytes = testing::read_bytes(path);
  ASSERT_EQ(bytes.size(), 5544u);
  bytes.resize(5444);
  testing::write_bytes(path, bytes);
  std::filesystem::remove(dir / "model-00002-of-00003.safetensors");
  testing::write_text(dir / "tokenizer.json", R"({"model": {"type": "BPE"}})");
  CliRun r = verify(q(dir));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out,
            "3 problems in " + dir.string() + ":\n"
            "  model-00002-of-00003.safetensors: missing: model.safetensors.index.json puts 9 tensors in this file; "
            "download this file\n"
            "  model-00003-of-00003.safetensors: 5,444 of 5,544 bytes — the download was cut (1 tensor ends past "
            "the end of the file, the first is lm_head.weight); download this file again\n"
            "  tokenizer.json: has no model.vocab; it is not a Hugging Face tokenizer file; download tokenizer.json "
            "again\n");
}

TEST(VerifyCli, BytesPastTheLastTensorAreReportedAsAWarning) {
  auto dir = testing::fresh_dir("verify_trailing");
  write_tiny_model(dir, kTinyConfig);
  auto path = dir / "model.safetensors";
  auto bytes = testing::read_bytes(path);
  const size_t whole = bytes.size();
  ASSERT_TRUE(whole > 11552 && whole < 1000000);  // 11,552 data bytes + header: one comma below
  bytes.resize(whole + 16);
  testing::write_bytes(path, bytes);
  CliRun r = verify(q(dir));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "1 problem in " + dir.string() + ":\n  warning: model.safetensors: the last tensor ends at byte " +
                       std::to_string(whole).insert(std::to_string(whole).size() - 3, ",") + " but the file has " +
                       std::to_string(whole + 16).insert(std::to_string(whole + 16).size() - 3, ",") +
                       " bytes (16 bytes belong to no tensor); loading ignores them; download the file again if it "
                       "should match the published one\n");
}

TEST(VerifyCli, JsonReport) {
  auto dir = testing::fresh_dir("verify_json");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2, .reshape = {{"model.layers.1.self_attn.k_proj.weight", {4, 16}}}});
  std::filesystem::remove(dir / "tokenizer_config.json");
  CliRun r = verify("--json " + q(dir));
  EXPECT_EQ(r.status, 1) << r.err;
  nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["ok"], false);
  ASSERT_EQ(report["problems"].size(), 2u) << report.dump(2);
  const auto& shape = report["problems"][0];
  EXPECT_EQ(shape["file"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(shape["tensor"], "model.layers.1.self_attn.k_proj.weight");
  EXPECT_EQ(shape["message"],
            "tensor model.layers.1.self_attn.k_proj.weight has shape [4, 16], config.json implies [8, 16] "
            "(num_key_value_heads=2, head_dim=4)");
  EXPECT_FALSE(shape["fix"].get<std::string>().empty());
  const auto& tok = report["problems"][1];
  EXPECT_EQ(tok["file"], "tokenizer_config.json");
  EXPECT_FALSE(tok.contains("tensor"));
  EXPECT_EQ(tok["fix"], "download tokenizer_config.json from the model's repository");
  // Files: config, index, 2 shards, tokenizer.json, tokenizer_config.json (absent).
  ASSERT_EQ(report["files"].size(), 6u);
  EXPECT_EQ(report["files"][0]["name"], "config.json");
  EXPECT_EQ(report["files"][1]["role"], "index");
  EXPECT_EQ(report["files"][2]["name"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(report["files"][2]["tensors"], 13);  // 27 tensors split 13 / 14
  EXPECT_EQ(report["files"][3]["tensors"], 14);
  EXPECT_EQ(report["files"][5]["present"], false);
  EXPECT_EQ(report["n_tensors"], 27);

  auto ok_dir = testing::fresh_dir("verify_json_ok");
  write_tiny_model(ok_dir, kTinyConfig);
  r = verify(q(ok_dir) + " --json");
  EXPECT_EQ(r.status, 0);
  report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["ok"], true);
  EXPECT_TRUE(report["problems"].empty());
  EXPECT_EQ(report["tensor_bytes"], 11552);
  EXPECT_EQ(report["architecture"], "Qwen2ForCausalLM");
}

TEST(VerifyCli, UsageErrorsExitTwo) {
  CliRun r = verify("");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("give the model directory"), std::string::npos) << r.err;
  auto missing = testing::fresh_dir("verify_usage") / "no-such-model";
  r = verify(q(missing));
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "error: " + missing.string() +
                       ": no such directory; give the model directory (the one with config.json)\n");
  EXPECT_TRUE(r.out.empty());
  auto dir = testing::fresh_dir("verify_usage_manifest");
  write_tiny_model(dir, kTinyConfig);
  r = verify(q(dir) + " --sha256 " + q(dir / "nope.sha256"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no such manifest file"), std::string::npos);
  r = verify(q(dir) + " --bogus");
  EXPECT_EQ(r.status, 2);
}

TEST(VerifyCli, UnsupportedArchitectureIsAProblem) {
  auto dir = testing::fresh_dir("verify_arch");
  write_tiny_model(dir, kTinyConfig);
  std::string config = kTinyConfig;
  config.replace(config.find("Qwen2ForCausalLM"), 16, "GPT2LMHeadModel");
  testing::write_text(dir / "config.json", config);
  CliRun r = verify(q(dir));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("  config.json: architecture \"GPT2LMHeadModel\" is not supported; supported: Qwen2ForCausalLM"),
            std::string::npos)
      << r.out;
}

TEST(VerifyCli, Sha256PrintsAManifestSha256sumAccepts) {
  auto dir = testing::fresh_dir("verify_sha");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2});
  CliRun r = verify(q(dir) + " --sha256");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto sums = testing::run_command("cd " + q(dir) +
                                         " && sha256sum config.json model.safetensors.index.json "
                                         "model-00001-of-00002.safetensors model-00002-of-00002.safetensors "
                                         "tokenizer.json tokenizer_config.json");
  ASSERT_EQ(sums.rc, 0) << sums.err;
  const std::string expected = sums.out;
  EXPECT_EQ(r.out, expected);
  EXPECT_EQ(r.err.substr(0, 4), "OK: ");  // the report goes to stderr in this mode

  // The printed manifest verifies, with DIR given after --sha256 too.
  auto manifest = dir.parent_path() / "verify_sha.sha256";
  testing::write_text(manifest, r.out);
  r = verify("--sha256 " + q(manifest) + " " + q(dir));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("sha256: 6 files match verify_sha.sha256\n"), std::string::npos) << r.out;

  // Change one data byte: headers still check out; only the hash catches it.
  auto shard = dir / "model-00002-of-00002.safetensors";
  auto bytes = testing::read_bytes(shard);
  bytes.back() ^= 0x01;
  testing::write_bytes(shard, bytes);
  const auto sum = testing::run_command("sha256sum " + q(shard));
  ASSERT_EQ(sum.rc, 0) << sum.err;
  const std::string now = sum.out;
  std::string before = expected.substr(expected.find("model-00002") - 66, 64);
  r = verify(q(dir) + " --sha256 " + q(manifest));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "1 problem in " + dir.string() + ":\n  model-00002-of-00002.safetensors: SHA-256 is " +
                       now.substr(0, 64) + " but verify_sha.sha256 says " + before +
                       " — the file is damaged or from another version; download this file again\n");
  r = verify(q(dir) + " --sha256 " + q(manifest) + " --json");
  nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["files"][3]["sha256"], now.substr(0, 64));

  // A manifest entry for a file that is gone.
  testing::write_text(manifest, expected + std::string(64, 'a') + "  README.md\n");
  bytes.back() ^= 0x01;
  testing::write_bytes(shard, bytes);
  r = verify(q(dir) + " --sha256 " + q(manifest));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("  README.md: listed in verify_sha.sha256 but missing; download this file\n"), std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace shardlm
