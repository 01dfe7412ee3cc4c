// Hostile checkpoints of issue 21: values that would index outside a buffer
// (eos_token_id outside the vocabulary), out-of-range sampling defaults,
// index entries naming files outside the model directory, a FIFO in place
// of a shard, and a padded tokenizer.json. Each is refused at load and
// reported by verify, naming the file and the field.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/defaults.h"
#include "loader/checkpoint.h"
#include "loader/generation_config.h"
#include "loader/verify.h"
#include "test_files.h"

namespace shardlm {
namespace {

using testing::kTinyConfig;
using testing::write_tiny_model;

// The error's message, or "(accepted)".
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// verify's problems, as one text.
std::string verify_text(const std::filesystem::path& dir) {
  std::string out;
  for (const Problem& p : verify_model_dir(dir).problems) out += p.text() + "\n";
  return out;
}

TEST(HostileCheckpoint, ConfigEosOutsideTheVocabularyIsRefused) {
  for (const char* eos : {"32", "-1", "[2, 99999]"}) {
    SCOPED_TRACE(eos);
    auto config = nlohmann::json::parse(kTinyConfig);  // vocab_size 32
    config["eos_token_id"] = nlohmann::json::parse(eos);
    const std::string why = refusal([&] { parse_model_config(config, "config.json"); });
    EXPECT_TRUE(contains(why, "config.json: eos_token_id")) << why;
    EXPECT_TRUE(contains(why, "outside the vocabulary [0, 32)")) << why;
  }
  auto config = nlohmann::json::parse(kTinyConfig);
  config["eos_token_id"] = nlohmann::json::array({0, 31});
  EXPECT_NO_THROW(parse_model_config(config, "config.json"));
}

TEST(HostileCheckpoint, GenerationConfigEosOutsideTheVocabularyIsRefusedAndVerifyReportsIt) {
  auto dir = testing::fresh_dir("hostile_gen_eos");
  write_tiny_model(dir, kTinyConfig);
  EXPECT_EQ(verify_text(dir), "");
  const ModelSpec spec = parse_model_config(nlohmann::json::parse(kTinyConfig), "config.json");
  testing::write_text(dir / "generation_config.json", R"({"eos_token_id": [2, 4096]})");
  const std::string why = refusal([&] { load_eos_token_ids(dir, spec); });
  EXPECT_TRUE(contains(why, "generation_config.json: eos_token_id 4096 is outside the vocabulary [0, 32)")) << why;
  const std::string report = verify_text(dir);
  EXPECT_TRUE(contains(report, "generation_config.json: eos_token_id 4096 is outside the vocabulary")) << report;
  testing::write_text(dir / "generation_config.json", R"({"eos_token_id": [2, 31]})");
  EXPECT_EQ(load_eos_token_ids(dir, spec), (std::vector<int64_t>{2, 31}));
}

TEST(HostileCheckpoint, OutOfRangeSamplingDefaultsAreRefusedNamingFileAndField) {
  auto dir = testing::fresh_dir("hostile_gen_defaults");
  write_tiny_model(dir, kTinyConfig);
  const std::pair<const char*, const char*> cases[] = {
      {R"({"top_k": -7})", "top_k is -7"},
      {R"({"top_p": 0})", "top_p is 0"},
      {R"({"top_p": 1.5})", "top_p is 1.5"},
      {R"({"temperature": -1})", "temperature is -1"},
      {R"({"min_p": 2})", "min_p is 2"},
      {R"({"repetition_penalty": 0})", "repetition_penalty is 0"},
      {R"({"max_new_tokens": 0})", "max_new_tokens is 0"},
  };
  for (const auto& [text, needle] : cases) {
    SCOPED_TRACE(text);
    testing::write_text(dir / "generation_config.json", text);
    const std::string why = refusal([&] { load_generation_defaults(dir); });
    EXPECT_TRUE(contains(why, "generation_config.json: ")) << why;
    EXPECT_TRUE(contains(why, needle)) << why;
    const std::string report = verify_text(dir);
    EXPECT_TRUE(contains(report, std::string("generation_config.json: ") + needle)) << report;
  }
  testing::write_text(dir / "generation_config.json", R"({"top_k": -1, "top_p": 1, "temperature": 0, "min_p": 0})");
  EXPECT_NO_THROW(load_generation_defaults(dir));
}

TEST(HostileCheckpoint, IndexEntriesOutsideTheDirectoryAreRefused) {
  EXPECT_TRUE(is_plain_file_name("model-00001-of-00002.safetensors"));
  for (const std::string& bad : std::vector<std::string>{"../../../../etc/hostname", "/etc/hostname", "sub/model.safetensors",
                                                         "..", ".", "", "a\\b.safetensors", std::string("a\0b", 3)}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(is_plain_file_name(bad));
  }
  auto dir = testing::fresh_dir("hostile_index_escape");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2});
  auto index = nlohmann::json::parse(testing::read_text(dir / kWeightsIndexFile));
  index["weight_map"]["model.norm.weight"] = "/etc/hostname";
  testing::write_text(dir / kWeightsIndexFile, index.dump());
  const std::string report = verify_text(dir);
  EXPECT_TRUE(contains(report, "model.safetensors.index.json: weight_map entry for tensor model.norm.weight is \"/etc/hostname\""))
      << report;
  const std::string why = refusal([&] { Checkpoint::open(dir); });
  EXPECT_TRUE(contains(why, "/etc/hostname")) << why;
}

TEST(HostileCheckpoint, AFifoInPlaceOfAShardIsRefusedWithoutBlocking) {
  auto dir = testing::fresh_dir("hostile_fifo_shard");
  write_tiny_model(dir, kTinyConfig, {.n_shards = 2});
  const auto shard = dir / testing::shard_name(2, 2);
  std::filesystem::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  // Before the fix, open() blocked here until a writer came (forever).
  const std::string report = verify_text(dir);
  EXPECT_TRUE(contains(report, testing::shard_name(2, 2))) << report;
  const std::string why = refusal([&] { Checkpoint::open(dir); });
  EXPECT_NE(why, "(accepted)");
}

TEST(HostileCheckpoint, AnOversizedTokenizerJsonIsRefusedByVerifyWithoutReadingIt) {
  auto dir = testing::fresh_dir("hostile_big_tokenizer");
  write_tiny_model(dir, kTinyConfig);
  // Sparse: no disk is written, and the file is never read.
  std::filesystem::resize_file(dir / "tokenizer.json", kMaxTokenizerFileBytes + 1);
  const std::string report = verify_text(dir);
  EXPECT_TRUE(contains(report, "tokenizer.json: 268435457 bytes, more than the limit of 256 MiB")) << report;
}

// JSON 100,000 levels deep in any checkpoint file is refused while it is
// parsed, naming the file: dump() or operator== on it (an error message, a
// comparison) would otherwise exhaust the stack long after loading.
TEST(HostileCheckpoint, DeeplyNestedJsonFilesAreRefusedNamingTheFile) {
  auto nested = [](int depth) { return std::string(size_t(depth), '[') + std::string(size_t(depth), ']'); };
  auto with_field = [](const std::string& object, const std::string& value) {
    return "{\"x\": " + value + ", " + object.substr(object.find('{') + 1);
  };
  auto dir = testing::fresh_dir("hostile_deep_json");
  write_tiny_model(dir, kTinyConfig);
  testing::write_text(dir / "config.json", with_field(kTinyConfig, nested(100000)));
  std::string why = refusal([&] { load_model_config(dir / "config.json"); });
  EXPECT_TRUE(contains(why, "config.json: JSON nested deeper than 128 levels")) << why;
  EXPECT_TRUE(contains(verify_text(dir), "config.json: JSON nested deeper than 128 levels")) << verify_text(dir);
  testing::write_text(dir / "config.json", with_field(kTinyConfig, nested(100)));  // deep, but within the limit
  EXPECT_NO_THROW(load_model_config(dir / "config.json"));

  testing::write_text(dir / "generation_config.json", "{\"top_k\": 5, \"x\": " + nested(100000) + "}");
  why = refusal([&] { load_generation_defaults(dir); });
  EXPECT_TRUE(contains(why, "generation_config.json: JSON nested deeper than 128 levels")) << why;
}

}  // namespace
}  // namespace shardlm
