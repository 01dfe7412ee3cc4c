// `shardlm tokenize` / `shardlm detokenize` end to end: output, --json,
// exit codes 0 / 1 (problem) / 2 (usage).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "tokenizer/tokenizer.h"

namespace shardlm {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out;  // stdout and stderr
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

CliRun run(const std::string& args) {
  const char* cli = std::getenv("SHARDLM_CLI");
  if (!cli || !*cli) cli = SHARDLM_DEFAULT_CLI;
  std::string cmd = quote(cli) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

fs::path model(const char* name) {
  const char* bin = std::getenv("SHARDLM_BINARY_DIR");
  fs::path p = fs::path(bin && *bin ? bin : SHARDLM_DEFAULT_BINARY_DIR) / ".cache" / "tokenizers" / name;
  if (!fs::exists(p / "tokenizer.json"))
    throw std::runtime_error(p.string() + "/tokenizer.json is missing: run the ctest fixture tokenizer_reference_setup");
  return p;
}

TEST(Cli, TokenizeAndDetokenizeRoundTrip) {
  std::string dir = model("qwen3").string();
  std::string text = "Hello, world! 你好 👍🏽 <|im_end|>";
  Tokenizer tok = Tokenizer::load(dir);
  auto ids = tok.encode(text);

  CliRun plain = run("tokenize " + quote(dir) + " --text " + quote(text));
  ASSERT_EQ(plain.code, 0) << plain.out;
  std::string csv;
  for (size_t i = 0; i < ids.size(); ++i) csv += (i ? "," : "") + std::to_string(ids[i]);
  EXPECT_EQ(plain.out, csv + "\n");

  CliRun js = run("tokenize " + quote(dir) + " --json --text " + quote(text));
  ASSERT_EQ(js.code, 0) << js.out;
  auto parsed = nlohmann::json::parse(js.out);
  EXPECT_EQ(parsed["ids"].get<std::vector<TokenId>>(), ids);
  EXPECT_EQ(parsed["n_tokens"], ids.size());
  EXPECT_EQ(parsed["tokens"][0], "Hello");

  CliRun back = run("detokenize " + quote(dir) + " --ids " + csv);
  ASSERT_EQ(back.code, 0) << back.out;
  EXPECT_EQ(back.out, text + "\n");

  CliRun back_json = run("detokenize " + quote(dir) + " --json --skip-special --ids " + csv + ",151900");
  ASSERT_EQ(back_json.code, 0) << back_json.out;
  auto d = nlohmann::json::parse(back_json.out);
  EXPECT_EQ(d["text"], "Hello, world! 你好 👍🏽 ");
  EXPECT_EQ(d["unknown_ids"], nlohmann::json::array({151900}));
}

TEST(Cli, LlamaTokenizeMatchesLibrary) {
  std::string dir = model("llama3").string();
  CliRun r = run("tokenize " + quote(dir) + " --json --text " + quote("I'LL count 1234567"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<TokenId>>(),
            Tokenizer::load(dir).encode("I'LL count 1234567"));
}

TEST(Cli, ExitCodes) {
  std::string dir = model("qwen3").string();
  CliRun missing = run("tokenize /nonexistent/model --text hi");
  EXPECT_EQ(missing.code, 1) << missing.out;
  EXPECT_NE(missing.out.find("tokenizer.json"), std::string::npos) << missing.out;
  CliRun no_text = run("tokenize " + quote(dir));
  EXPECT_EQ(no_text.code, 2) << no_text.out;
  CliRun both = run("tokenize " + quote(dir) + " --text a --file /etc/hostname");
  EXPECT_EQ(both.code, 2) << both.out;
  CliRun bad_ids = run("detokenize " + quote(dir) + " --ids 1,x,3");
  EXPECT_EQ(bad_ids.code, 2) << bad_ids.out;
  EXPECT_NE(bad_ids.out.find("\"x\""), std::string::npos) << bad_ids.out;
  CliRun negative = run("detokenize " + quote(dir) + " --ids -5");
  EXPECT_EQ(negative.code, 2) << negative.out;
  CliRun no_ids = run("detokenize " + quote(dir));
  EXPECT_EQ(no_ids.code, 2) << no_ids.out;
  CliRun bad_utf8 = run("tokenize " + quote(dir) + " --text \"$(printf '\\377')\"");
  EXPECT_EQ(bad_utf8.code, 1) << bad_utf8.out;
  EXPECT_NE(bad_utf8.out.find("UTF-8"), std::string::npos) << bad_utf8.out;
}

}  // namespace
}  // namespace shardlm
