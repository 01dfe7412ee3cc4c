// Structured outputs through the OpenAI surface: the request forms parsed
// into grammar specs (and refused with a 400 naming the parameter), then
// `shardlm serve` on a synthetic model answering response_format
// json_schema with JSON that python3-jsonschema validates, tool_choice with
// a well-formed hermes call, guided_choice / guided_regex, and a schema it
// cannot compile with a 400 naming the keyword.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/serving_backend.h"
#include "server/structured_output.h"
#include "support/process.h"

namespace {

using json = nlohmann::ordered_json;
using shardlm::grammar::GrammarSpec;
using shardlm::server::ApiException;
using shardlm::server::parse_structured_output;
using shardlm::testing::env_or;

std::string refused_param(const std::string& body) {
  try {
    parse_structured_output(json::parse(body));
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    return e.error().param;
  }
  return "(accepted)";
}

TEST(StructuredOutputForms, EachFormBecomesOneSpec) {
  EXPECT_FALSE(parse_structured_output(json::parse(R"({"response_format":{"type":"text"}})")));
  EXPECT_FALSE(parse_structured_output(json::parse(R"({"tool_choice":"auto","tools":[]})")));
  auto s = parse_structured_output(json::parse(R"({"response_format":{"type":"json_object"}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, GrammarSpec::Kind::kJsonObject);
  EXPECT_FALSE(s->json.compact);
  s = parse_structured_output(json::parse(
      R"({"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":{"type":"integer"}}}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, GrammarSpec::Kind::kJsonSchema);
  EXPECT_TRUE(s->json.compact);  // json_schema defaults to the compact layout
  EXPECT_EQ(s->schema, json::parse(R"({"type":"integer"})"));
  s = parse_structured_output(json::parse(R"({"structured_outputs":{"regex":"a+"}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->text, "a+");
  s = parse_structured_output(json::parse(R"({"guided_choice":["x","y"]})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->choices, (std::vector<std::string>{"x", "y"}));
  s = parse_structured_output(json::parse(R"({"guided_json":"{\"type\":\"string\"}"})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->schema, json::parse(R"({"type":"string"})"));
  s = parse_structured_output(json::parse(R"({"tools":[{"type":"function","function":{"name":"a"}},
      {"type":"function","function":{"name":"b","parameters":{"type":"object"}}}],
      "tool_choice":{"type":"function","function":{"name":"b"}}})"));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->kind, GrammarSpec::Kind::kToolCalls);
  ASSERT_EQ(s->tools.size(), 1u);
  EXPECT_EQ(s->tools[0].name, "b");
  EXPECT_FALSE(s->parallel_tool_calls);
  s = parse_structured_output(json::parse(R"({"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":"required"})"));
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->parallel_tool_calls);
}

TEST(StructuredOutputForms, BadOrUnsupportedFormsNameTheParameter) {
  EXPECT_EQ(refused_param(R"({"response_format":{"type":"yaml"}})"), "response_format.type");
  EXPECT_EQ(refused_param(R"({"response_format":{"type":"json_schema"}})"), "response_format.json_schema");
  EXPECT_EQ(refused_param(R"({"structured_outputs":{"grammar":"root ::= \"a\""}})"), "structured_outputs.grammar");
  EXPECT_EQ(refused_param(R"({"guided_grammar":"x"})"), "guided_grammar");
  EXPECT_EQ(refused_param(R"({"guided_choice":[]})"), "guided_choice");
  EXPECT_EQ(refused_param(R"({"guided_json":"{not json"})"), "guided_json");
  EXPECT_EQ(refused_param(R"({"guided_regex":"a","response_format":{"type":"json_object"}})"), "guided_regex");
  EXPECT_EQ(refused_param(R"({"tool_choice":"required"})"), "tool_choice");
  EXPECT_EQ(refused_param(R"({"tools":[{"type":"function","function":{"name":"a"}}],
                               "tool_choice":{"type":"function","function":{"name":"zz"}}})"), "tool_choice");
}

// ---- end to end: shardlm serve on a synthetic model ----

struct Serve {
  pid_t pid = -1;
  int port = 0;
  std::string log_path;
  ~Serve() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
  }
  std::string log() const {
    std::ifstream in(log_path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

class StructuredServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cli_ = env_or("SHARDLM_CLI", "shardlm");
    dir_ = env_or("SHARDLM_BINARY_DIR", "/tmp") + "/tests/server/structured." + std::to_string(getpid());
    const std::string cmd = cli_ + " make-model --like qwen2.5-0.5b --layers 2 --vocab 1024 --intermediate 256 --seed 3 --out " +
                            dir_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    serve_ = new Serve;
    serve_->port = shardlm::testing::free_loopback_port();
    serve_->log_path = dir_ + "/serve.log";
    std::vector<std::string> args = {cli_, "serve", dir_, "--port", std::to_string(serve_->port), "--kv-cache-memory",
                                     "32MiB", "--served-model-name", "m"};
    serve_->pid = shardlm::testing::spawn_logged(args, serve_->log_path);
    httplib::Client c("127.0.0.1", serve_->port);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return;
      if (waitpid(serve_->pid, nullptr, WNOHANG) == serve_->pid) {
        serve_->pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "serve did not become healthy:\n" << serve_->log();
  }
  static void TearDownTestSuite() {
    delete serve_;
    serve_ = nullptr;
    std::filesystem::remove_all(dir_);
  }

  static std::pair<int, json> post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", serve_->port);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path.c_str(), body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  static json chat(const json& extra) {
    json body = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "Give me a person."}}})},
                 {"max_tokens", 300}};
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
    return body;
  }

  static std::string cli_, dir_;
  static Serve* serve_;
};
std::string StructuredServe::cli_, StructuredServe::dir_;
Serve* StructuredServe::serve_ = nullptr;

const char* const kPerson = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":0,"maximum":120},
  "email":{"type":"string","format":"email"},
  "tags":{"type":"array","items":{"type":"string","enum":["a","b","c"]},"maxItems":3},
  "born":{"type":"string","format":"date"}},
  "required":["name","age","tags","born"],"additionalProperties":false})";

TEST_F(StructuredServe, JsonSchemaResponsesValidate) {
  const json schema = json::parse(kPerson);
  const std::string cases = dir_ + "/cases.jsonl";
  std::ofstream out(cases);
  int n = 0;
  for (double temperature : {0.0, 1.0}) {
    for (int seed = 0; seed < (temperature > 0 ? 3 : 1); ++seed) {
      json extra = {{"temperature", temperature}, {"seed", seed},
                    {"response_format", {{"type", "json_schema"},
                                         {"json_schema", {{"name", "person"}, {"strict", true}, {"schema", schema}}}}}};
      auto [status, r] = post("/v1/chat/completions", chat(extra));
      ASSERT_EQ(status, 200) << r.dump() << "\n" << serve_->log();
      const auto& choice = r["choices"][0];
      EXPECT_EQ(choice["finish_reason"], "stop") << r.dump();
      const std::string text = choice["message"]["content"].get<std::string>();
      out << json{{"name", "person t=" + std::to_string(temperature)}, {"schema", schema}, {"text", text}}.dump() << "\n";
      ++n;
    }
  }
  out.close();
  const std::string src = env_or("SHARDLM_SOURCE_DIR", ".");
  const auto v = shardlm::testing::run_command("/usr/bin/python3 " + shardlm::testing::shell_quote(src + "/tests/grammar/validate.py") +
                                               " " + shardlm::testing::shell_quote(cases), true);
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_NE(v.out.find(std::to_string(n) + "/" + std::to_string(n) + " texts validate"), std::string::npos) << v.out;
}

// Integer and number ranges of any width, exclusive bounds and multipleOf,
// sampled at several seeds and validated by python3-jsonschema.
TEST_F(StructuredServe, NumericRangesOfAnyWidthValidate) {
  const json schema = json::parse(R"({"type":"object","properties":{
    "zip":{"type":"integer","minimum":10000,"maximum":99999},
    "delta":{"type":"integer","minimum":-123456789012,"exclusiveMaximum":-4000},
    "big":{"type":"integer","minimum":100000000000000000},
    "step":{"type":"integer","minimum":-30,"maximum":900,"multipleOf":25},
    "ratio":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1},
    "temp":{"type":"number","minimum":-40.5,"maximum":60.25}},
    "required":["zip","delta","big","step","ratio","temp"],"additionalProperties":false})");
  const std::string cases = dir_ + "/numeric.jsonl";
  std::ofstream out(cases);
  const int n = 5;
  for (int seed = 0; seed < n; ++seed) {
    json extra = {{"temperature", 1.0}, {"seed", seed},
                  {"response_format", {{"type", "json_schema"},
                                       {"json_schema", {{"name", "numbers"}, {"strict", true}, {"schema", schema}}}}}};
    auto [status, r] = post("/v1/chat/completions", chat(extra));
    ASSERT_EQ(status, 200) << r.dump() << "\n" << serve_->log();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
    const std::string text = r["choices"][0]["message"]["content"].get<std::string>();
    out << json{{"name", "numbers seed=" + std::to_string(seed)}, {"schema", schema}, {"text", text}}.dump() << "\n";
  }
  out.close();
  const std::string src = env_or("SHARDLM_SOURCE_DIR", ".");
  const auto v = shardlm::testing::run_command("/usr/bin/python3 " + shardlm::testing::shell_quote(src + "/tests/grammar/validate.py") +
                                               " " + shardlm::testing::shell_quote(cases), true);
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_NE(v.out.find(std::to_string(n) + "/" + std::to_string(n) + " texts validate"), std::string::npos) << v.out;
  // A multipleOf the grammar cannot express is a 400 naming it.
  json refused = {{"response_format", {{"type", "json_schema"},
                                       {"json_schema", {{"name", "x"}, {"schema", json::parse(R"({"type":"integer","multipleOf":7})")}}}}}};
  auto [status, r] = post("/v1/chat/completions", chat(refused));
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("multipleOf"), std::string::npos) << r.dump();
}

// Legacy completions logprobs over the real engine: top_logprobs always
// holds the sampled token (alone for logprobs 0); with echo they cover the
// prompt's tokens first, which prompt_logprobs scores the same.
TEST_F(StructuredServe, CompletionLogprobsIncludeTheSampledToken) {
  for (int k : {0, 2}) {
    auto [status, r] = post("/v1/completions", json{{"model", "m"}, {"prompt", "Count:"}, {"max_tokens", 6},
                                                    {"temperature", 1.0}, {"seed", 3}, {"logprobs", k}});
    ASSERT_EQ(status, 200) << r.dump();
    const json& lp = r["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), lp["top_logprobs"].size()) << lp.dump();
    ASSERT_FALSE(lp["tokens"].empty()) << lp.dump();
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      const json& top = lp["top_logprobs"][i];
      const std::string tok = lp["tokens"][i];
      ASSERT_TRUE(top.contains(tok)) << "k=" << k << " " << lp.dump();
      EXPECT_EQ(top[tok].get<double>(), lp["token_logprobs"][i].get<double>());
      if (k == 0) EXPECT_EQ(top.size(), 1u) << top.dump();
      else EXPECT_TRUE(top.size() == 2u || top.size() == 3u) << top.dump();
    }
  }
  // echo with logprobs: the prompt's tokens first (the first unscored),
  // their logprobs those prompt_logprobs reports for the same positions.
  auto [status, r] = post("/v1/completions", json{{"model", "m"}, {"prompt", "Count: one two"}, {"max_tokens", 2},
                                                  {"temperature", 0}, {"echo", true}, {"logprobs", 0},
                                                  {"prompt_logprobs", 1}});
  ASSERT_EQ(status, 200) << r.dump();
  const json& c = r["choices"][0];
  const json& lp = c["logprobs"];
  const json& prompt = c["prompt_logprobs"];
  const size_t n_prompt = prompt.size();
  ASSERT_GE(n_prompt, 2u) << r.dump();
  EXPECT_EQ(size_t(r["usage"]["prompt_tokens"]), n_prompt);
  ASSERT_EQ(lp["tokens"].size(), n_prompt + size_t(r["usage"]["completion_tokens"])) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_TRUE(prompt[0].is_null());
  for (size_t i = 1; i < n_prompt; ++i) {
    const json& first = prompt[i].begin().value();  // the prompt token itself
    EXPECT_NEAR(first["logprob"].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-6) << i;
    EXPECT_EQ(first["decoded_token"], lp["tokens"][i]) << i;
    EXPECT_GE(first["rank"].get<int>(), 1);
  }
  EXPECT_EQ(c["text"].get<std::string>().rfind("Count: one two", 0), 0u) << c.dump();
}

TEST_F(StructuredServe, UnsupportedSchemaIsA400NamingTheKeyword) {
  json extra = {{"response_format", {{"type", "json_schema"},
                                     {"json_schema", {{"name", "x"}, {"schema", json::parse(R"({"type":"string","contentMediaType":"text/html"})")}}}}}};
  auto [status, r] = post("/v1/chat/completions", chat(extra));
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("'contentMediaType'"), std::string::npos) << r.dump();
}

TEST_F(StructuredServe, NamedToolChoiceGivesAHermesCallWithValidArguments) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{
      "type":"object","properties":{"city":{"type":"string","maxLength":10},"unit":{"enum":["c","f"]}},
      "required":["city","unit"],"additionalProperties":false}}},
      {"type":"function","function":{"name":"other","parameters":{"type":"object","properties":{}}}}])");
  json extra = {{"tools", tools}, {"temperature", 0},
                {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  auto [status, r] = post("/v1/chat/completions", chat(extra));
  ASSERT_EQ(status, 200) << r.dump();
  const auto& msg = r["choices"][0]["message"];
  json args;
  if (msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty()) {
    // A tool-call parser turned the text into tool_calls.
    EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
    args = json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
  } else {
    const std::string text = msg["content"].get<std::string>();
    const std::string head = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ";
    ASSERT_EQ(text.rfind(head, 0), 0u) << text;
    const std::string tail = "}\n</tool_call>";
    ASSERT_GE(text.size(), head.size() + tail.size());
    ASSERT_EQ(text.substr(text.size() - tail.size()), tail) << text;
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    args = json::parse(text.substr(head.size(), text.size() - head.size() - tail.size()));
  }
  EXPECT_TRUE(args["city"].is_string());
  EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f") << args.dump();
  EXPECT_EQ(args.size(), 2u);
}

TEST_F(StructuredServe, GuidedChoiceAndRegexOnCompletions) {
  auto [s1, r1] = post("/v1/completions", json{{"model", "m"}, {"prompt", "The answer is"}, {"max_tokens", 20},
                                               {"guided_choice", {"yes", "no", "maybe later"}}});
  ASSERT_EQ(s1, 200) << r1.dump();
  const std::string choice = r1["choices"][0]["text"];
  EXPECT_TRUE(choice == "yes" || choice == "no" || choice == "maybe later") << choice;
  EXPECT_EQ(r1["choices"][0]["finish_reason"], "stop");
  auto [s2, r2] = post("/v1/completions", json{{"model", "m"}, {"prompt", "Call"}, {"max_tokens", 30}, {"temperature", 1.0},
                                               {"seed", 4}, {"structured_outputs", {{"regex", "\\(\\d{3}\\) \\d{3}-\\d{4}"}}}});
  ASSERT_EQ(s2, 200) << r2.dump();
  const std::string phone = r2["choices"][0]["text"];
  EXPECT_TRUE(std::regex_match(phone, std::regex("\\(\\d{3}\\) \\d{3}-\\d{4}"))) << phone;
  auto [s3, r3] = post("/v1/completions", json{{"model", "m"}, {"prompt", "x"}, {"guided_regex", "(a"}});
  EXPECT_EQ(s3, 400) << r3.dump();
}

}  // namespace
