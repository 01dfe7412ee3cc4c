#include "loader/sha256.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "support/process.h"
#include "test_files.h"

namespace shardlm {
namespace {

TEST(Sha256, KnownVectors) {
  // FIPS 180-2 test vectors.
  EXPECT_EQ(sha256_bytes("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_bytes(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, FileMatchesSha256sumAcrossReadBoundaries) {
  auto dir = testing::fresh_dir("sha256_file");
  // 2.5 MiB of a pattern: spans three 1 MiB reads.
  std::vector<uint8_t> bytes(5 << 19);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + (i >> 11));
  testing::write_bytes(dir / "blob.bin", bytes);
  const auto sum = testing::run_command("sha256sum " + testing::shell_quote((dir / "blob.bin").string()));
  ASSERT_EQ(sum.rc, 0) << sum.err;
  EXPECT_EQ(sha256_file(dir / "blob.bin"), sum.out.substr(0, 64));
  try {
    (void)sha256_file(dir / "nope.bin");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(Sha256, ManifestFormat) {
  std::string text =
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  config.json\n"
      "\n"
      "# comment\n"
      "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855 *./model.safetensors\r\n"
      "not a hash  file\n"
      "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad config.json\n";
  std::vector<std::string> bad;
  std::vector<ManifestEntry> entries = parse_sha256_manifest(text, &bad);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].name, "config.json");
  EXPECT_EQ(entries[1].name, "model.safetensors");
  EXPECT_EQ(entries[1].sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(bad[0], "line 5: not a hash  file");
  EXPECT_EQ(bad[1].substr(0, 8), "line 6: ");
}

}  // namespace
}  // namespace shardlm
