// open_checkpoint's own check of model.safetensors.index.json (issue 21):
// weight_map may name only plain file names in the model directory, so a
// checkpoint cannot make serve open ../../../../etc/hostname or /dev/zero.
// verify has the same check (tests/loader/hostile_checkpoint_test.cpp); this
// is the loader's, which serve uses.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/weight_source.h"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointSource, WeightMapNamesOnlyPlainFilesInTheModelDirectory) {
  const fs::path dir = fs::temp_directory_path() / ("shardlm_checkpoint_source_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "sub" / "model.safetensors") << "not opened";
  for (const std::string& file : {"../../../../etc/hostname", "/etc/hostname", "sub/model.safetensors", "..", ".", "",
                                  "a\\b.safetensors"}) {
    SCOPED_TRACE(file);
    std::ofstream(dir / "model.safetensors.index.json")
        << nlohmann::json{{"weight_map", {{"model.embed_tokens.weight", file}}}}.dump();
    try {
      open_checkpoint(dir);
      FAIL() << "weight_map file " << file << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruptFile) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find("model.safetensors.index.json"), std::string::npos) << what;
      EXPECT_NE(what.find("not the plain name of a file in the model directory"), std::string::npos) << what;
    }
  }
  // A plain name passes the check and fails only because the shard is not there.
  std::ofstream(dir / "model.safetensors.index.json")
      << nlohmann::json{{"weight_map", {{"model.embed_tokens.weight", "model-00001-of-00002.safetensors"}}}}.dump();
  try {
    open_checkpoint(dir);
    FAIL() << "a missing shard opened";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("not the plain name"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardlm
