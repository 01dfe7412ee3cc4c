// Tool-call and reasoning parsers over recorded model outputs (Qwen2.5 /
// Qwen3 hermes blocks, Llama 3.1 JSON calls), fed whole, one byte at a time,
// and split at every byte: all must give the same content and calls, and no
// tag text may reach the content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/chat_output.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

#include "tool_parser_feed.h"

namespace shardlm::server {
namespace {

ToolParserOptions counting_ids() {
  auto n = std::make_shared<int>(0);
  ToolParserOptions o;
  o.make_id = [n] { return "call_" + std::to_string((*n)++); };
  return o;
}

using Result = testing::ParseResult;
using testing::expect_same;

// Feeds `text` in pieces cut at `cuts` (sorted offsets).
Result run(const std::string& parser_name, const std::string& text, const std::vector<size_t>& cuts,
           bool parallel = true) {
  ToolParserOptions o = counting_ids();
  o.parallel_tool_calls = parallel;
  auto p = make_tool_call_parser(parser_name, o);
  return testing::feed_in_pieces(*p, text, cuts);
}

// Whole == byte by byte == every single split; streamed deltas have the
// OpenAI shape (first delta of a call: id + name; later: arguments only).
Result check_all_splits(const std::string& parser, const std::string& text, bool parallel = true,
                        bool complete = true) {
  Result whole = run(parser, text, {}, parallel);
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  Result bytes = run(parser, text, every, parallel);
  expect_same(whole, bytes, "byte by byte");
  for (const auto& d : bytes.deltas) {
    if (!d.id.empty()) EXPECT_FALSE(d.name.empty());
  }
  for (size_t i = 1; i < text.size(); ++i) expect_same(whole, run(parser, text, {i}, parallel), "split at " + std::to_string(i));
  for (const auto& c : whole.calls) {
    if (complete) EXPECT_NO_THROW((void)nlohmann::json::parse(c.arguments)) << c.arguments;
  }
  return whole;
}

TEST(HermesToolParser, Qwen25SingleCallWithContentBefore) {
  const std::string text =
      "Let me check the weather.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"celsius\"}}\n</tool_call>";
  Result r = check_all_splits("hermes", text);
  EXPECT_EQ(r.content, "Let me check the weather.\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments), nlohmann::json({{"city", "Paris"}, {"unit", "celsius"}}));
  EXPECT_TRUE(r.called);
}

TEST(HermesToolParser, Qwen3ParallelCallsAndTextAfterDropped) {
  const std::string text =
      "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, {\"y\": \"}</tool_call>\"}]}}\n</tool_call>\n"
      "<tool_call>\n{\"arguments\": {}, \"name\": \"b\"}\n</tool_call>\nsome trailing words";
  Result r = check_all_splits("hermes", text);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments)["x"][1]["y"], "}</tool_call>");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(r.calls[1].id, "call_1");

  Result first_only = check_all_splits("hermes", text, /*parallel=*/false);
  ASSERT_EQ(first_only.calls.size(), 1u);
  EXPECT_EQ(first_only.calls[0].name, "a");
}

TEST(HermesToolParser, NoArgumentsAndUnicodeEscapesInName) {
  Result r = check_all_splits("hermes", "<tool_call>{\"name\": \"f\\u00e9\"}</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f\xc3\xa9");
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(HermesToolParser, PlainTextAndLookalikeTagsStayContent) {
  const std::string text = "a < b and <tool_ not a tag, <tool_call>not json</tool_call> end <tool";
  Result r = check_all_splits("hermes", text);
  EXPECT_EQ(r.content, text);
  EXPECT_TRUE(r.calls.empty());
  EXPECT_FALSE(r.called);
}

TEST(HermesToolParser, HoldsBackAPartialTag) {
  auto p = make_tool_call_parser("hermes", counting_ids());
  EXPECT_EQ(p->feed("Sure <tool_").content, "Sure ");
  ToolParseDelta d = p->feed("call>{\"name\": \"get");
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(d.tool_calls.empty());  // the name is not complete yet
  d = p->feed("\", \"arguments\": {\"q\"");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].id, "call_0");
  EXPECT_EQ(d.tool_calls[0].name, "get");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"q\"");
  d = p->feed(": 1}}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].id.empty());
  EXPECT_TRUE(d.tool_calls[0].name.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, ": 1}");
}

TEST(HermesToolParser, CutShortCallKeepsWhatCame) {
  Result r = check_all_splits("hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"unfinish", true, false);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": \"unfinish");
  // A block cut before its name is text.
  Result t = check_all_splits("hermes", "hi <tool_call>\n{\"na");
  EXPECT_EQ(t.content, "hi <tool_call>\n{\"na");
  EXPECT_TRUE(t.calls.empty());
}

TEST(Llama3JsonToolParser, PythonTagAndParameters) {
  const std::string text = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"query\": \"shardlm\", \"k\": 3}}";
  Result r = check_all_splits("llama3_json", text);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "search");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments), nlohmann::json({{"query", "shardlm"}, {"k", 3}}));
}

TEST(Llama3JsonToolParser, BareJsonAndSemicolonSeparatedCalls) {
  const std::string text =
      "{\"name\": \"a\", \"arguments\": {\"n\": 1}}; {\"name\": \"b\", \"parameters\": {\"s\": \"x;y\"}}";
  Result r = check_all_splits("llama3_json", text);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(nlohmann::json::parse(r.calls[1].arguments)["s"], "x;y");
  Result one = check_all_splits("llama3_json", text, false);
  EXPECT_EQ(one.calls.size(), 1u);
}

TEST(Llama3JsonToolParser, ContentAndNamelessJsonStayContent) {
  for (std::string text : {"The answer is {\"name\": 1}", "  {\"answer\": 42}", "<|python", "  "}) {
    Result r = check_all_splits("llama3_json", text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST(ToolCallParser, UnknownNameIsRefusedAndTemplatesAreDetected) {
  EXPECT_THROW(make_tool_call_parser("mistral"), Error);
  EXPECT_EQ(detect_tool_call_parser("{% for tool in tools %}<tool_call>{{ tool }}</tool_call>{% endfor %}"), "hermes");
  EXPECT_EQ(detect_tool_call_parser("<|start_header_id|>ipython<|end_header_id|>"), "llama3_json");
  EXPECT_EQ(detect_tool_call_parser("{{ messages[0].content }}"), "");
}

ChatDelta run_chat(const ChatOutputOptions& o, const std::string& text, size_t step) {
  ChatOutputParser p(o, counting_ids());
  ChatDelta all;
  auto take = [&](ChatDelta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    all.tool_calls.insert(all.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  for (size_t i = 0; i < text.size(); i += step) take(p.feed(std::string_view(text).substr(i, step)));
  take(p.finish());
  return all;
}

TEST(ReasoningParser, Qwen3ThinkBlockWholeAndStreamed) {
  const std::string text = "<think>\nThe user wants 2+2. <thin that is 4.\n</think>\n\nIt is 4.";
  ChatOutputOptions o;
  o.reasoning_parser = "qwen3";
  for (size_t step = 1; step <= text.size(); ++step) {
    ChatDelta d = run_chat(o, text, step);
    EXPECT_EQ(d.reasoning, "\nThe user wants 2+2. <thin that is 4.\n") << step;
    EXPECT_EQ(d.content, "\n\nIt is 4.") << step;
  }
  // No think block: all content. Prompt that opened the block: reasoning first.
  EXPECT_EQ(run_chat(o, "Just <b>an</b> answer", 1).content, "Just <b>an</b> answer");
  o.starts_in_reasoning = true;
  ChatDelta d = run_chat(o, "hmm</think>done", 2);
  EXPECT_EQ(d.reasoning, "hmm");
  EXPECT_EQ(d.content, "done");
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_THROW(check_reasoning_parser("deepseek_r1"), Error);
}

TEST(ChatOutputParser, ReasoningThenToolCall) {
  const std::string text =
      "<think>I should call it.</think>\n\nCalling.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  ChatOutputOptions o;
  o.reasoning_parser = "qwen3";
  o.tool_call_parser = "hermes";
  for (size_t step = 1; step <= text.size(); ++step) {
    ChatDelta d = run_chat(o, text, step);
    EXPECT_EQ(d.reasoning, "I should call it.");
    EXPECT_EQ(d.content, "\n\nCalling.");
    std::vector<ToolCall> calls;
    accumulate(d.tool_calls, &calls);
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(calls[0].arguments, "{\"a\": 1}");
  }
  ChatMessage m = parse_chat_output(o, text);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "f");
  EXPECT_EQ(m.tool_calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(chat_finish_reason("stop", true), "tool_calls");
  EXPECT_EQ(chat_finish_reason("length", true), "length");
  EXPECT_EQ(chat_finish_reason("stop", false), "stop");
}

}  // namespace
}  // namespace shardlm::server
