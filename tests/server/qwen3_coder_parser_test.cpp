// The qwen3_coder tool-call parser over Qwen3-Coder's XML calls, fed whole,
// byte by byte and split at every byte: all give the same content and calls,
// no tag text reaches the content, and parameter values follow the types of
// the tool's schema.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "server/chat_output.h"
#include "server/http_server.h"
#include "server/qwen3_coder_tool_parser.h"
#include "server/tool_call_parser.h"

#include "tool_parser_feed.h"

namespace shardlm::server {
namespace {

using json = nlohmann::ordered_json;

const json kTools = json::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
    "city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},"scale":{"type":["number","null"]},
    "opts":{"type":"object"},"tags":{"type":"array"},"zip":{"type":"string"}}}}},
  {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}])");

using Result = testing::ParseResult;
using testing::expect_same;

Result run(const std::string& text, const std::vector<size_t>& cuts, bool parallel = true) {
  ToolParserOptions o;
  auto n = std::make_shared<int>(0);
  o.make_id = [n] { return "call_" + std::to_string((*n)++); };
  o.parallel_tool_calls = parallel;
  o.parameter_types = tool_parameter_types(kTools);
  auto p = make_tool_call_parser("qwen3_coder", o);
  return testing::feed_in_pieces(*p, text, cuts);
}

Result check_all_splits(const std::string& text, bool parallel = true) {
  const Result whole = run(text, {}, parallel);
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const Result bytes = run(text, every, parallel);
  expect_same(whole, bytes, "byte by byte");
  for (const auto& d : bytes.deltas) {
    if (!d.id.empty()) {
      EXPECT_FALSE(d.name.empty());
    }
  }
  for (size_t i = 1; i < text.size(); ++i) expect_same(whole, run(text, {i}, parallel), "split at " + std::to_string(i));
  for (const auto& c : whole.calls) EXPECT_TRUE(json::accept(c.arguments)) << c.arguments;
  if (whole.called) {
    EXPECT_EQ(whole.content.find("<tool_call>"), std::string::npos) << whole.content;
  }
  return whole;
}

const std::string kCall =
    "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, CA\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=scale>\n1.5e2\n</parameter>\n"
    "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
    "<parameter=zip>\n02139\n</parameter>\n<parameter=note>\nline one\nline <b>two</b>\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(Qwen3CoderToolParser, ValuesFollowTheSchemaTypes) {
  const Result r = check_all_splits(kCall);
  EXPECT_EQ(r.content, "I'll check.\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  const json args = json::parse(r.calls[0].arguments);
  EXPECT_EQ(args["city"], "San Francisco, CA");
  EXPECT_EQ(args["days"], 3);
  EXPECT_EQ(args["metric"], true);
  EXPECT_EQ(args["scale"], 150.0);
  EXPECT_EQ(args["opts"], json::parse(R"({"a":[1,2]})"));
  EXPECT_EQ(args["tags"], json::parse(R"(["x","y"])"));
  EXPECT_EQ(args["zip"], "02139");                    // a string stays a string
  EXPECT_EQ(args["note"], "line one\nline <b>two</b>");  // not in the schema: a string, inner newline kept
  EXPECT_TRUE(r.called);
}

TEST(Qwen3CoderToolParser, StreamsNameThenOneFragmentPerParameter) {
  ToolParserOptions o;
  o.make_id = [] { return std::string("call_x"); };
  o.parameter_types = tool_parameter_types(kTools);
  auto p = make_tool_call_parser("qwen3_coder", o);
  EXPECT_EQ(p->feed("Sure <tool_").content, "Sure ");
  ToolParseDelta d = p->feed("call>\n<function=get_wea");
  EXPECT_TRUE(d.content.empty());
  EXPECT_TRUE(d.tool_calls.empty());  // the name is not complete yet
  d = p->feed("ther>\n<parameter=days>\n4");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].id, "call_x");
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  d = p->feed("2\n</parameter>\n<parameter=city>\nRome\n</parameter>\n");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"days\": 42");
  EXPECT_EQ(d.tool_calls[1].arguments, ", \"city\": \"Rome\"");
  d = p->feed("</function>\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "}");
  EXPECT_TRUE(d.tool_calls[0].id.empty());
}

TEST(Qwen3CoderToolParser, ParallelCallsNoParametersAndTextAfterDropped) {
  const std::string text =
      "<tool_call>\n<function=now>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
      "<parameter=days>\nsoon\n</parameter>\n</function>\n</tool_call>\ntrailing words";
  const Result r = check_all_splits(text);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "now");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.calls[1].id, "call_1");
  EXPECT_EQ(json::parse(r.calls[1].arguments)["days"], "soon");  // not an integer: kept as written
  const Result one = check_all_splits(text, /*parallel=*/false);
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "now");
}

TEST(Qwen3CoderToolParser, PlainTextAndMalformedBlocksStayContent) {
  for (std::string text : {"a < b, <tool_ not a tag, <tool_call>{\"name\": 1}</tool_call> end <tool",
                           "x <tool_call>\n<function=\n</tool_call>", "hi <tool_call>\n<func"}) {
    const Result r = check_all_splits(text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
    EXPECT_FALSE(r.called);
  }
}

TEST(Qwen3CoderToolParser, CutShortCallKeepsItsCompleteParameters) {
  const Result r = check_all_splits(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n1");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(json::parse(r.calls[0].arguments), json::parse(R"({"city":"Oslo"})"));
  // A missing </parameter> ends at the next parameter or the function's end.
  const Result lax = check_all_splits(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\n</tool_call>");
  ASSERT_EQ(lax.calls.size(), 1u);
  EXPECT_EQ(json::parse(lax.calls[0].arguments), json::parse(R"({"city":"Oslo","days":2})"));
}

TEST(Qwen3CoderToolParser, SelectedByNameAndDetectedFromTheTemplate) {
  const auto& names = tool_call_parser_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen3_coder"), names.end());
  EXPECT_EQ(detect_tool_call_parser("<tool_call>\n<function={{ name }}>\n<parameter={{ p }}>\n"), "qwen3_coder");
  EXPECT_EQ(detect_tool_call_parser("<tool_call>{{ tool }}</tool_call>"), "hermes");
  // Through the chat output parser, with the request's parameter types.
  ChatOutputOptions co;
  co.tool_call_parser = "qwen3_coder";
  co.parameter_types = tool_parameter_types(kTools);
  ChatOutputParser p(co);
  ChatDelta all = p.feed("<tool_call>\n<function=get_weather>\n<parameter=days>\n7\n</parameter>\n</function>\n</tool_call>");
  ChatDelta end = p.finish();
  all.tool_calls.insert(all.tool_calls.end(), end.tool_calls.begin(), end.tool_calls.end());
  std::vector<ToolCall> calls;
  accumulate(all.tool_calls, &calls);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].arguments, "{\"days\": 7}");
  EXPECT_TRUE(all.content.empty());
}

// Through the HTTP server over a scripted backend whose template writes
// Qwen3-Coder calls: the parser is picked from the template, and the reply
// (whole and streamed) carries tool_calls with typed arguments.
class Qwen3CoderServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_.template_source = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>\n<function=f>\n<parameter=p>\n";
    backend_.script = "Looking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    backend_.pace = std::chrono::milliseconds(0);
    ServerOptions options;
    options.port = 0;
    options.served_model_names = {"tiny"};
    server_ = std::make_unique<HttpServer>(backend_, options);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    server_->stop(std::chrono::milliseconds(0));
    thread_.join();
  }
  json body(bool stream) const {
    json b = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Weather?"}}}}, {"max_tokens", 200},
              {"tools", kTools}};
    if (stream) b["stream"] = true;
    return b;
  }
  testing::FakeBackend backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(Qwen3CoderServeTest, WholeAndStreamedRepliesCarryTypedToolCalls) {
  auto r = client_->Post("/v1/chat/completions", body(false).dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json whole = json::parse(r->body);
  const json& msg = whole["choices"][0]["message"];
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(msg["content"], "Looking.\n");  // the text before the call, as written
  ASSERT_EQ(msg["tool_calls"].size(), 1u) << r->body;
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json::parse(R"({"city":"Paris","days":3})"));

  auto s = client_->Post("/v1/chat/completions", body(true).dump(), "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200) << s->body;
  std::istringstream in(s->body);
  std::string line, content, arguments, name;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const json c = json::parse(line.substr(6));
    if (c["choices"].empty()) continue;
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls"))
      for (const json& t : delta["tool_calls"]) {
        if (t["function"].contains("name")) name += t["function"]["name"].get<std::string>();
        arguments += t["function"]["arguments"].get<std::string>();
      }
  }
  EXPECT_EQ(content, "Looking.\n");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(json::parse(arguments), json::parse(R"({"city":"Paris","days":3})")) << arguments;
}

}  // namespace
}  // namespace shardlm::server
