// Anthropic's Messages API through the real HTTP server over the scripted
// backend: request translation (system, tool_use / tool_result history,
// tools, tool_choice -> grammar), the message shape, the stream's event
// order, thinking blocks, stop reasons, count_tokens, auth and errors in
// Anthropic's shape, and what Claude Code sends.
#include "agent_test_support.h"

namespace shardlm::server {
namespace {

using testing::AgentServerTest;
using testing::json;
using testing::kCallScript;
using testing::kHermesTemplate;
using testing::SseFrame;

json weather_tools() {
  return json::parse(R"([{"name": "get_weather", "description": "Weather", "cache_control": {"type": "ephemeral"},
      "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
      {"name": "get_time", "defer_loading": true, "input_schema": {"type": "object", "properties": {}}}])");
}

json hello(int max_tokens = 5) {
  return {{"model", "tiny"}, {"max_tokens", max_tokens}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
}

class AnthropicTest : public AgentServerTest {
 protected:
  // Asserts Anthropic's error shape with this status and error type.
  json expect_error(const httplib::Result& r, int status, const std::string& type, const std::string& needle = "") {
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, status) << r->body;
    json body = json::parse(r->body);
    EXPECT_EQ(body["type"], "error") << r->body;
    EXPECT_EQ(body["error"]["type"], type) << r->body;
    EXPECT_TRUE(body["error"]["message"].is_string());
    if (!needle.empty()) {
      EXPECT_NE(body["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
    }
    return body;
  }
  std::vector<std::string> event_names(const std::vector<SseFrame>& frames) {
    std::vector<std::string> names;
    for (const auto& f : frames) {
      EXPECT_EQ(f.event, f.data["type"]) << "the event line names the data's type";
      names.push_back(f.event);
    }
    return names;
  }
};

TEST_F(AnthropicTest, MessageHasAnthropicShape) {
  start();
  json body = hello(5);
  body["system"] = "Be brief.";
  json m = ok("/v1/messages", body);
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "tiny");
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_EQ(m["content"].size(), 1u);
  EXPECT_EQ(m["content"][0], json({{"type", "text"}, {"text", "abcde"}}));
  EXPECT_EQ(m["stop_reason"], "max_tokens");
  EXPECT_TRUE(m["stop_sequence"].is_null());
  // "system:Be brief.\nuser:hi\nassistant:" is 35 bytes = 35 fake tokens.
  EXPECT_EQ(m["usage"]["input_tokens"], 35);
  EXPECT_EQ(m["usage"]["output_tokens"], 5);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 0);
  EXPECT_EQ(backend_.last_params.max_tokens, 5);
}

TEST_F(AnthropicTest, CachedPromptTokensAreCacheReads) {
  backend_.cached = 16;
  start();
  json m = ok("/v1/messages", hello(2));
  // "user:hi\nassistant:" = 18 tokens, 16 of them from the prefix cache.
  EXPECT_EQ(m["usage"]["input_tokens"], 2);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 16);
}

TEST_F(AnthropicTest, HistoryWithToolUseAndToolResultsBecomesChatMessages) {
  backend_.template_source = kHermesTemplate;
  start();
  json body = {{"model", "tiny"}, {"max_tokens", 2}, {"tools", weather_tools()},
               {"system", {{{"type", "text"}, {"text", "Part one."}, {"cache_control", {{"type", "ephemeral"}}}},
                           {{"type", "text"}, {"text", "Part two."}}}},
               {"messages", json::parse(R"([
      {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and the time?"}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Two calls.", "signature": "x"},
          {"type": "text", "text": "Calling."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
          {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"},
          {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": false,
           "content": [{"type": "text", "text": "noon"}]},
          {"type": "text", "text": "Thanks.", "cache_control": {"type": "ephemeral"}}]}])")}};
  ok("/v1/messages", body);
  std::lock_guard<std::mutex> lock(backend_.seen_mutex);
  const json& msgs = backend_.last_messages;
  ASSERT_EQ(msgs.size(), 6u) << msgs.dump();
  EXPECT_EQ(msgs[0], json({{"role", "system"}, {"content", "Part one.\nPart two."}}));
  EXPECT_EQ(msgs[1]["role"], "user");
  EXPECT_EQ(msgs[2]["role"], "assistant");
  EXPECT_EQ(msgs[2]["content"], "Calling.");
  EXPECT_EQ(msgs[2]["reasoning_content"], "Two calls.");
  ASSERT_EQ(msgs[2]["tool_calls"].size(), 2u);
  EXPECT_EQ(msgs[2]["tool_calls"][0]["id"], "toolu_1");
  EXPECT_EQ(msgs[2]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(msgs[3], json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "21C"}}));
  EXPECT_EQ(msgs[4], json({{"role", "tool"}, {"tool_call_id", "toolu_2"}, {"content", "noon"}}));
  EXPECT_EQ(msgs[5], json({{"role", "user"}, {"content", "Thanks."}}));
  // Tools as chat tools: input_schema is the parameters; hints dropped.
  ASSERT_EQ(backend_.last_tools.size(), 2u);
  EXPECT_EQ(backend_.last_tools[0]["type"], "function");
  EXPECT_EQ(backend_.last_tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(backend_.last_tools[0]["function"]["parameters"]["required"], json({"city"}));
  EXPECT_FALSE(backend_.last_tools[1]["function"].contains("defer_loading"));
}

TEST_F(AnthropicTest, ToolCallBecomesToolUseWholeAndStreamed) {
  backend_.template_source = kHermesTemplate;
  backend_.script = kCallScript;
  start();
  json body = hello(200);
  body["tools"] = weather_tools();
  json m = ok("/v1/messages", body);
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0], json({{"type", "text"}, {"text", "Checking."}}));
  EXPECT_EQ(m["content"][1]["type"], "tool_use");
  EXPECT_EQ(m["content"][1]["id"].get<std::string>().rfind("toolu_", 0), 0u);
  EXPECT_EQ(m["content"][1]["name"], "get_weather");
  EXPECT_EQ(m["content"][1]["input"], json({{"city", "Paris"}}));
  EXPECT_EQ(m["stop_reason"], "tool_use");

  auto frames = stream("/v1/messages", body);
  std::vector<std::string> names = event_names(frames);
  ASSERT_GE(names.size(), 8u);
  EXPECT_EQ(names[0], "message_start");
  EXPECT_EQ(names[1], "ping");
  EXPECT_EQ(names[names.size() - 2], "message_delta");
  EXPECT_EQ(names.back(), "message_stop");
  EXPECT_EQ(frames[0].data["message"]["content"], json::array());
  EXPECT_TRUE(frames[0].data["message"]["stop_reason"].is_null());
  // Blocks: each start ... deltas ... stop, indexes from 0, never two open.
  std::string text, args, tool_name;
  int open = -1, n_blocks = 0;
  for (const auto& f : frames) {
    if (f.event == "content_block_start") {
      EXPECT_EQ(open, -1) << "a block is still open";
      open = f.data["index"];
      EXPECT_EQ(open, n_blocks);
      if (f.data["content_block"]["type"] == "tool_use") {
        tool_name = f.data["content_block"]["name"];
        EXPECT_EQ(f.data["content_block"]["input"], json::object());
      }
    } else if (f.event == "content_block_delta") {
      EXPECT_EQ(f.data["index"], open);
      if (f.data["delta"]["type"] == "text_delta") text += f.data["delta"]["text"].get<std::string>();
      if (f.data["delta"]["type"] == "input_json_delta") args += f.data["delta"]["partial_json"].get<std::string>();
    } else if (f.event == "content_block_stop") {
      EXPECT_EQ(f.data["index"], open);
      open = -1;
      ++n_blocks;
    }
  }
  EXPECT_EQ(n_blocks, 2);
  EXPECT_EQ(text, "Checking.");
  EXPECT_EQ(tool_name, "get_weather");
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}}));
  const json& delta = frames[frames.size() - 2].data;
  EXPECT_EQ(delta["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(delta["usage"]["output_tokens"], static_cast<int>(kCallScript.size()));
}

TEST_F(AnthropicTest, ThinkingBlocksComeFromTheReasoningParser) {
  backend_.script = "<think>Let me see.</think>\n\nHello.";
  ServerOptions o;
  o.api.reasoning_parser = "qwen3";
  start(o);
  json m = ok("/v1/messages", hello(100));
  ASSERT_EQ(m["content"].size(), 2u) << m.dump();
  EXPECT_EQ(m["content"][0]["type"], "thinking");
  EXPECT_EQ(m["content"][0]["thinking"], "Let me see.");
  EXPECT_EQ(m["content"][1], json({{"type", "text"}, {"text", "Hello."}}));
  EXPECT_EQ(m["stop_reason"], "end_turn");

  auto frames = stream("/v1/messages", hello(100));
  std::string thinking, text;
  std::vector<std::string> kinds;
  for (const auto& f : frames) {
    if (f.event == "content_block_start") kinds.push_back(f.data["content_block"]["type"]);
    if (f.event != "content_block_delta") continue;
    if (f.data["delta"]["type"] == "thinking_delta") thinking += f.data["delta"]["thinking"].get<std::string>();
    if (f.data["delta"]["type"] == "text_delta") text += f.data["delta"]["text"].get<std::string>();
  }
  EXPECT_EQ(kinds, (std::vector<std::string>{"thinking", "text"}));
  EXPECT_EQ(thinking, "Let me see.");
  EXPECT_EQ(text, "Hello.");
  EXPECT_EQ(frames[frames.size() - 2].data["delta"]["stop_reason"], "end_turn");

  // thinking disabled reaches the template as enable_thinking false; a
  // budget is refused (not enforced), adaptive accepted.
  json off = hello(2);
  off["thinking"] = {{"type", "disabled"}};
  ok("/v1/messages", off);
  json budget = hello(2);
  budget["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  expect_error(post("/v1/messages", budget), 400, "invalid_request_error", "budget_tokens");
}

TEST_F(AnthropicTest, StopSequenceIsReported) {
  backend_.script = "Hello STOP more";
  start();
  json body = hello(100);
  body["stop_sequences"] = {"STOP", "never"};
  json m = ok("/v1/messages", body);
  EXPECT_EQ(m["content"][0]["text"], "Hello ");
  EXPECT_EQ(m["stop_reason"], "stop_sequence");
  EXPECT_EQ(m["stop_sequence"], "STOP");
  EXPECT_EQ(backend_.last_params.stop, (std::vector<std::string>{"STOP", "never"}));
  auto frames = stream("/v1/messages", body);
  EXPECT_EQ(frames[frames.size() - 2].data["delta"]["stop_reason"], "stop_sequence");
  EXPECT_EQ(frames[frames.size() - 2].data["delta"]["stop_sequence"], "STOP");
  // Without a stop string the end is end_turn.
  body.erase("stop_sequences");
  backend_.script = "Hello";
  EXPECT_EQ(ok("/v1/messages", body)["stop_reason"], "end_turn");
}

TEST_F(AnthropicTest, ToolChoiceBecomesTheGrammarAndSamplingIsPassedOn) {
  backend_.template_source = kHermesTemplate;
  start();
  json body = hello(50);
  body["tools"] = weather_tools();
  body["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["top_k"] = 7;
  body["metadata"] = {{"user_id", "u1"}};
  ok("/v1/messages", body);
  ASSERT_EQ(backend_.specs.size(), 1u);
  EXPECT_EQ(backend_.specs[0].kind, grammar::GrammarSpec::Kind::kToolCalls);
  ASSERT_EQ(backend_.specs[0].tools.size(), 1u);
  EXPECT_EQ(backend_.specs[0].tools[0].name, "get_weather");
  EXPECT_EQ(backend_.last_params.temperature, 0.5);
  EXPECT_EQ(backend_.last_params.top_p, 0.9);
  EXPECT_EQ(backend_.last_params.top_k, 7);

  body["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  ok("/v1/messages", body);
  ASSERT_EQ(backend_.specs.size(), 2u);
  EXPECT_EQ(backend_.specs[1].tools.size(), 2u);
  EXPECT_FALSE(backend_.specs[1].parallel_tool_calls);

  body["tool_choice"] = {{"type", "none"}};
  ok("/v1/messages", body);
  EXPECT_EQ(backend_.specs.size(), 2u);
  EXPECT_TRUE(backend_.last_tools.is_null() || backend_.last_tools.empty()) << "tool_choice none renders no tools";
}

TEST_F(AnthropicTest, CountTokensCountsThePrompt) {
  backend_.template_source = kHermesTemplate;
  start();
  json body = {{"model", "tiny"}, {"system", "S"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"tools", weather_tools()}, {"tool_choice", {{"type", "any"}}}};
  json r = ok("/v1/messages/count_tokens", body);
  // "system:S\nuser:hi\nassistant:" (the fake renders no tools into the text).
  EXPECT_EQ(r["input_tokens"], 27);
  EXPECT_TRUE(backend_.specs.empty()) << "counting compiles no grammar";
}

TEST_F(AnthropicTest, WhatClaudeCodeSendsIsAccepted) {
  backend_.template_source = kHermesTemplate;
  ServerOptions o;
  o.api_key = "sk-test";
  start(o);
  json body = {{"model", "tiny"}, {"max_tokens", 3}, {"stream", false},
               {"system", {{{"type", "text"}, {"text", "You are Claude Code."}, {"cache_control", {{"type", "ephemeral"}}}}}},
               {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"},
                                                              {"cache_control", {{"type", "ephemeral"}}}}}}}}},
               {"tools", weather_tools()},
               {"thinking", {{"type", "adaptive"}}},
               {"context_management", {{"edits", {{{"type", "clear_thinking_20251015"}, {"keep", "all"}}}}}},
               {"output_config", {{"effort", "high"}}},
               {"metadata", {{"user_id", "user_abc"}}},
               {"temperature", 1}};
  httplib::Headers headers = {{"x-api-key", "sk-test"}, {"anthropic-version", "2023-06-01"},
                              {"anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14"}};
  json m = ok("/v1/messages?beta=true", body, headers);
  EXPECT_EQ(m["type"], "message");
  // Claude Code 2.1 sends its environment as a system message after the user
  // turn (and keeps it when retrying a 400): rendered in place.
  json with_system = body;
  with_system["messages"].push_back({{"role", "system"}, {"content", {{{"type", "text"}, {"text", "# Environment"}}}}});
  with_system["thinking"] = {{"type", "adaptive"}, {"display", "omitted"}};
  ok("/v1/messages?beta=true", with_system, headers);
  {
    std::lock_guard<std::mutex> lock(backend_.seen_mutex);
    ASSERT_EQ(backend_.last_messages.size(), 3u);
    EXPECT_EQ(json(backend_.last_messages[2]), json({{"role", "system"}, {"content", "# Environment"}}));
  }
  json other_role = body;
  other_role["messages"].push_back({{"role", "tool"}, {"content", "x"}});
  expect_error(post("/v1/messages?beta=true", other_role, headers), 400, "invalid_request_error", "role");
  // Authorization: Bearer works too; no key, or a wrong one, is a 401 in Anthropic's shape.
  EXPECT_EQ(post("/v1/messages", body, {{"Authorization", "Bearer sk-test"}})->status, 200);
  expect_error(post("/v1/messages", body), 401, "authentication_error");
  expect_error(post("/v1/messages", body, {{"x-api-key", "wrong"}}), 401, "authentication_error");
  // An unknown route under /v1/messages is a 404 in Anthropic's shape.
  expect_error(post("/v1/messages/batches", body, headers), 404, "not_found_error");
}

TEST_F(AnthropicTest, RefusalsNameTheField) {
  backend_.template_source = kHermesTemplate;
  start();
  auto with = [](const char* key, json value) {
    json b = hello(2);
    b[key] = std::move(value);
    return b;
  };
  json no_max = hello(2);
  no_max.erase("max_tokens");
  expect_error(post("/v1/messages", no_max), 400, "invalid_request_error", "max_tokens");
  expect_error(post("/v1/messages", with("max_tokens", 0)), 400, "invalid_request_error", "max_tokens");
  expect_error(post("/v1/messages", with("bogus", 1)), 400, "invalid_request_error", "bogus");
  expect_error(post("/v1/messages", with("mcp_servers", json::array({{{"type", "url"}}}))), 400, "invalid_request_error", "mcp_servers");
  expect_error(post("/v1/messages", with("tools", json::parse(R"([{"type": "web_search_20250305", "name": "web_search"}])"))),
               400, "invalid_request_error", "server tool");
  expect_error(post("/v1/messages", with("temperature", 1.5)), 400, "invalid_request_error", "temperature");
  expect_error(post("/v1/messages", with("messages", json::parse(R"([{"role": "user", "content": [
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])"))),
               400, "invalid_request_error", "image");
  expect_error(post("/v1/messages", with("messages", json::parse(R"([{"role": "user", "content": "hi"},
      {"role": "assistant", "content": "The answer is"}])"))),
               400, "invalid_request_error", "prefill");
  expect_error(post("/v1/messages", with("tool_choice", {{"type", "tool"}, {"name", "nope"}})), 400,
               "invalid_request_error");
  expect_error(post("/v1/messages", with("model", "claude-opus-4")), 404, "not_found_error", "claude-opus-4");
  expect_error(client_->Post("/v1/messages", hello(2).dump(), "text/plain"), 415, "invalid_request_error");
  expect_error(client_->Post("/v1/messages", "{\"model\": ", "application/json"), 400, "invalid_request_error");
  // The server keeps serving.
  EXPECT_EQ(ok("/v1/messages", hello(1))["type"], "message");
}

// null for an optional field means absent, as on chat completions.
TEST_F(AnthropicTest, NullOptionalFieldsMeanAbsent) {
  start();
  for (const char* f : {"system", "tools", "tool_choice", "temperature", "top_p", "top_k", "stop_sequences", "metadata",
                        "stream", "thinking"}) {
    json body = hello(5);
    body[f] = nullptr;
    auto r = post("/v1/messages", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << f << ": null -> " << r->body;
  }
}

}  // namespace
}  // namespace shardlm::server
