// Replays the fuzzing corpus (fuzz/corpus/safetensors_header/) through the
// header parser in the normal build: files named valid-* must parse cleanly,
// every other file must produce at least one error, and none may crash.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "loader/safetensors.h"
#include "test_files.h"

namespace shardlm {
namespace {

std::filesystem::path corpus_dir() {
  const char* source = std::getenv("SHARDLM_SOURCE_DIR");
#ifdef SHARDLM_TEST_SOURCE_DIR
  if (source == nullptr) source = SHARDLM_TEST_SOURCE_DIR;
#endif
  return std::filesystem::path(source ? source : ".") / "fuzz" / "corpus" / "safetensors_header";
}

TEST(FuzzCorpus, ReplaysThroughTheParser) {
  std::filesystem::path dir = corpus_dir();
  ASSERT_TRUE(std::filesystem::is_directory(dir)) << dir;
  size_t n_files = 0, n_valid = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::vector<uint8_t> bytes = testing::read_bytes(entry.path());
    std::string name = entry.path().filename().string();
    SafetensorsHeader header = parse_safetensors_header(bytes, name);
    ++n_files;
    if (name.rfind("valid-", 0) == 0) {
      ++n_valid;
      EXPECT_TRUE(header.problems.empty()) << name << ": " << header.problems[0].text();
      EXPECT_FALSE(header.tensors.empty()) << name;
    } else if (name.rfind("invalid-", 0) == 0) {
      EXPECT_FALSE(header.ok()) << name << " should be refused";
    }
    // Every problem names the file.
    for (const Problem& p : header.problems) EXPECT_EQ(p.file, name);
  }
  EXPECT_GE(n_files, 8u);
  EXPECT_GE(n_valid, 2u);
}

}  // namespace
}  // namespace shardlm
