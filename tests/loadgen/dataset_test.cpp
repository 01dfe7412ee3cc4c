#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "loadgen/dataset.h"

namespace shardlm::loadgen {
namespace {

int64_t count_words(const std::string& s) {
  std::istringstream in(s);
  std::string w;
  int64_t n = 0;
  while (in >> w) ++n;
  return n;
}

TEST(Dataset, RandomLengthsStayInRangeAndAreSeeded) {
  RandomDatasetOptions o;
  o.n_prompts = 50;
  o.input_len = 100;
  o.output_len = 20;
  o.range_ratio = 0.1;
  o.seed = 7;
  auto a = make_random_dataset(o);
  auto b = make_random_dataset(o);
  ASSERT_EQ(a.size(), 50u);
  std::set<int64_t> lens;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_GE(a[i].prompt_len, 90);
    EXPECT_LE(a[i].prompt_len, 110);
    EXPECT_GE(a[i].output_len, 18);
    EXPECT_LE(a[i].output_len, 22);
    EXPECT_EQ(count_words(a[i].prompt), a[i].prompt_len);  // one word per token
    lens.insert(a[i].prompt_len);
  }
  EXPECT_GT(lens.size(), 5u);
  o.seed = 8;
  EXPECT_NE(make_random_dataset(o)[0].prompt, a[0].prompt);
}

TEST(Dataset, TokenIdPromptsHaveExactLengths) {
  RandomDatasetOptions o;
  o.n_prompts = 5;
  o.input_len = 64;
  o.range_ratio = 0.0;
  o.token_ids = true;
  o.vocab_size = 5000;
  for (const auto& r : make_random_dataset(o)) {
    EXPECT_TRUE(r.prompt.empty());
    ASSERT_EQ(r.prompt_ids.size(), 64u);
    for (int64_t id : r.prompt_ids) {
      EXPECT_GE(id, kFirstTokenId);
      EXPECT_LT(id, 5000);
    }
  }
}

TEST(Dataset, SharedPrefixRequestsShareOneOfNPrefixes) {
  SharedPrefixOptions o;
  o.n_prompts = 12;
  o.n_prefixes = 3;
  o.prefix_len = 30;
  o.suffix_len = 10;
  auto reqs = make_shared_prefix_dataset(o);
  ASSERT_EQ(reqs.size(), 12u);
  std::map<std::string, int> per_prefix;
  std::set<std::string> suffixes;
  for (const auto& r : reqs) {
    EXPECT_EQ(count_words(r.prompt), 40);
    EXPECT_EQ(r.prompt_len, 40);
    size_t cut = 0;
    for (int w = 0; w < 30; ++w) cut = r.prompt.find(' ', cut) + 1;
    per_prefix[r.prompt.substr(0, cut)]++;
    suffixes.insert(r.prompt.substr(cut));
  }
  EXPECT_EQ(per_prefix.size(), 3u);
  for (const auto& [p, n] : per_prefix) EXPECT_EQ(n, 4);
  EXPECT_EQ(suffixes.size(), 12u);
}

TEST(Dataset, JsonlPromptAndShareGpt) {
  std::string text =
      "{\"prompt\": \"Hello there\", \"output_len\": 7}\n"
      "\n"
      "{\"conversations\": [{\"from\": \"system\", \"value\": \"sys\"}, {\"from\": \"human\", \"value\": "
      "\"What is 2+2?\"}, {\"from\": \"gpt\", \"value\": \"4\"}, {\"from\": \"human\", \"value\": \"later\"}]}\n";
  auto reqs = parse_jsonl_dataset(text, "mem.jsonl", 5, 99);
  ASSERT_EQ(reqs.size(), 5u);
  EXPECT_EQ(reqs[0].prompt, "Hello there");
  EXPECT_EQ(reqs[0].output_len, 7);
  EXPECT_EQ(reqs[1].prompt, "What is 2+2?");
  EXPECT_EQ(reqs[1].output_len, 99);
  EXPECT_EQ(reqs[2].prompt, "Hello there");  // cycles
  EXPECT_EQ(reqs[3].prompt, "What is 2+2?");
  EXPECT_GT(reqs[1].prompt_len, 0);
}

TEST(Dataset, JsonlErrorsNameFileAndLine) {
  auto message = [](const std::string& text) {
    try {
      parse_jsonl_dataset(text, "data.jsonl", 3, 10);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{\"prompt\": \"ok\"}\n{not json\n").find("data.jsonl:2"), std::string::npos);
  EXPECT_NE(message("{\"text\": \"x\"}\n").find("data.jsonl:1: needs a \"prompt\""), std::string::npos);
  EXPECT_NE(message("{\"prompt\": 5}\n").find("must be a string"), std::string::npos);
  EXPECT_NE(message("{\"prompt\": \"a\", \"output_len\": -1}\n").find("output_len"), std::string::npos);
  EXPECT_NE(message("{\"conversations\": [{\"from\": \"gpt\", \"value\": \"x\"}]}").find("no turn"),
            std::string::npos);
  EXPECT_NE(message("\n\n").find("holds no prompts"), std::string::npos);
}

TEST(Dataset, JsonlFromFile) {
  std::string path = std::string(::testing::TempDir()) + "/loadgen_ds.jsonl";
  std::ofstream(path) << "{\"prompt\": \"from file\"}\n";
  auto reqs = load_jsonl_dataset(path, 2, 16);
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[1].prompt, "from file");
  EXPECT_THROW(load_jsonl_dataset(path + ".missing", 2, 16), Error);
}

}  // namespace
}  // namespace shardlm::loadgen
