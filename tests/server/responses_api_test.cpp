// OpenAI's Responses API through the real HTTP server over the scripted
// backend: input items -> chat messages, output items, usage, the semantic
// stream events in order, tool_choice / text.format -> grammar, the store
// (GET, DELETE, previous_response_id, count and byte bounds, 404s), what
// Codex sends, and the refusals.
#include "agent_test_support.h"
#include "server/response_store.h"

namespace shardlm::server {
namespace {

using testing::AgentServerTest;
using testing::json;
using testing::kCallScript;
using testing::kHermesTemplate;
using testing::SseFrame;

json weather_tools() {
  return json::parse(R"([{"type": "function", "name": "get_weather", "description": "Weather", "strict": true,
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
      {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}])");
}

class ResponsesTest : public AgentServerTest {
 protected:
  json expect_error(const httplib::Result& r, int status, const std::string& param, const std::string& needle = "") {
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, status) << r->body;
    json body = json::parse(r->body);
    EXPECT_TRUE(body["error"]["message"].is_string()) << r->body;
    EXPECT_TRUE(body["error"]["type"].is_string()) << r->body;
    if (!param.empty()) {
      EXPECT_EQ(body["error"]["param"], param) << r->body;
    }
    if (!needle.empty()) {
      EXPECT_NE(body["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
    }
    return body;
  }
  json messages_seen() {
    std::lock_guard<std::mutex> lock(backend_.seen_mutex);
    return backend_.last_messages;
  }
};

TEST_F(ResponsesTest, CreateHasTheResponseShape) {
  backend_.script = "Hello.";
  backend_.cached = 4;
  start();
  json r = ok("/v1/responses", {{"model", "tiny"}, {"instructions", "Be brief."}, {"input", "hi"}, {"max_output_tokens", 50}});
  EXPECT_EQ(r["object"], "response");
  EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_EQ(r["status"], "completed");
  EXPECT_TRUE(r["incomplete_details"].is_null());
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["instructions"], "Be brief.");
  EXPECT_EQ(r["max_output_tokens"], 50);
  EXPECT_EQ(r["store"], true);
  ASSERT_EQ(r["output"].size(), 1u);
  const json& msg = r["output"][0];
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["status"], "completed");
  EXPECT_EQ(msg["id"].get<std::string>().rfind("msg_", 0), 0u);
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  EXPECT_EQ(msg["content"][0]["text"], "Hello.");
  // "system:Be brief.\nuser:hi\nassistant:" = 35 fake tokens.
  EXPECT_EQ(r["usage"]["input_tokens"], 35);
  EXPECT_EQ(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(r["usage"]["output_tokens"], 6);
  EXPECT_EQ(r["usage"]["total_tokens"], 41);
  EXPECT_EQ(messages_seen(), json::parse(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])"));
  EXPECT_EQ(backend_.last_params.max_tokens, 50);

  // Cut by max_output_tokens: incomplete, saying why.
  json cut = ok("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 3}});
  EXPECT_EQ(cut["status"], "incomplete");
  EXPECT_EQ(cut["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(cut["output"][0]["content"][0]["text"], "Hel");
}

TEST_F(ResponsesTest, InputItemsBecomeChatMessages) {
  backend_.template_source = kHermesTemplate;
  start();
  json input = json::parse(R"([
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
      {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}, {"type": "input_text", "text": "In Paris."}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need a call."}], "encrypted_content": null},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
      {"type": "message", "role": "user", "content": "Thanks."}])");
  ok("/v1/responses", {{"instructions", "Obey."}, {"input", input}, {"tools", weather_tools()}, {"max_output_tokens", 2}});
  json msgs = messages_seen();
  ASSERT_EQ(msgs.size(), 6u) << msgs.dump();
  EXPECT_EQ(msgs[0], json({{"role", "system"}, {"content", "Obey.\n\nYou are Codex."}})) << "leading system turns merge";
  EXPECT_EQ(msgs[1], json({{"role", "user"}, {"content", "Weather?\nIn Paris."}}));
  EXPECT_EQ(msgs[2]["role"], "assistant");
  EXPECT_EQ(msgs[2]["content"], "Calling.");
  EXPECT_EQ(msgs[2]["reasoning_content"], "Need a call.");
  ASSERT_EQ(msgs[2]["tool_calls"].size(), 2u);
  EXPECT_EQ(msgs[2]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(msgs[2]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(msgs[3], json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21C"}}));
  EXPECT_EQ(msgs[4], json({{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "noon"}}));
  EXPECT_EQ(msgs[5], json({{"role", "user"}, {"content", "Thanks."}}));
  std::lock_guard<std::mutex> lock(backend_.seen_mutex);
  EXPECT_EQ(backend_.last_tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(backend_.last_tools[0]["function"]["parameters"]["required"], json({"city"}));
}

TEST_F(ResponsesTest, FunctionCallsWholeAndStreamedInOrder) {
  backend_.template_source = kHermesTemplate;
  backend_.script = kCallScript;
  start();
  json body = {{"input", "Weather?"}, {"tools", weather_tools()}, {"max_output_tokens", 200}};
  json r = ok("/v1/responses", body);
  ASSERT_EQ(r["output"].size(), 2u) << r.dump();
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "Checking.");
  const json& call = r["output"][1];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(call["status"], "completed");

  auto frames = stream("/v1/responses", body);
  ASSERT_FALSE(frames.empty());
  // Event names, with runs of deltas folded into one.
  std::vector<std::string> order;
  for (size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ(frames[i].event, frames[i].data["type"]);
    EXPECT_EQ(frames[i].data["sequence_number"], static_cast<int>(i));
    if (order.empty() || order.back() != frames[i].event || frames[i].event.find(".delta") == std::string::npos)
      order.push_back(frames[i].event);
  }
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"};
  EXPECT_EQ(order, expected);
  EXPECT_EQ(frames[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(frames[0].data["response"]["output"], json::array());
  std::string text, args;
  json added_call;
  for (const auto& f : frames) {
    if (f.event == "response.output_item.added" && f.data["item"]["type"] == "function_call") added_call = f.data["item"];
    if (f.event == "response.output_text.delta") text += f.data["delta"].get<std::string>();
    if (f.event == "response.function_call_arguments.delta") args += f.data["delta"].get<std::string>();
  }
  EXPECT_EQ(text, "Checking.");
  EXPECT_EQ(json::parse(args), json({{"city", "Paris"}}));
  const json& done = frames.back().data["response"];
  EXPECT_EQ(done["status"], "completed");
  ASSERT_EQ(done["output"].size(), 2u);
  EXPECT_EQ(done["output"][1]["arguments"], args);
  EXPECT_EQ(done["output"][1]["call_id"], added_call["call_id"]) << "the item keeps its identity";
  EXPECT_EQ(done["output"][1]["id"], added_call["id"]);
  EXPECT_EQ(added_call["arguments"], "");
  EXPECT_EQ(done["usage"]["output_tokens"], static_cast<int>(kCallScript.size()));
}

TEST_F(ResponsesTest, ReasoningItemsFromTheReasoningParser) {
  backend_.script = "<think>hmm</think>\n\nHi.";
  ServerOptions o;
  o.api.reasoning_parser = "qwen3";
  start(o);
  json r = ok("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 100}});
  ASSERT_EQ(r["output"].size(), 2u) << r.dump();
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0], json({{"type", "reasoning_text"}, {"text", "hmm"}}));
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hi.");
  EXPECT_EQ(r["usage"]["output_tokens_details"]["reasoning_tokens"], 3);
  auto frames = stream("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 100}});
  std::string reasoning;
  for (const auto& f : frames)
    if (f.event == "response.reasoning_text.delta") reasoning += f.data["delta"].get<std::string>();
  EXPECT_EQ(reasoning, "hmm");
  EXPECT_EQ(frames.back().data["response"]["output"][1]["content"][0]["text"], "Hi.");
}

TEST_F(ResponsesTest, ToolChoiceAndTextFormatBecomeGrammars) {
  backend_.template_source = kHermesTemplate;
  start();
  json body = {{"input", "Weather?"}, {"tools", weather_tools()}, {"max_output_tokens", 20}};
  body["tool_choice"] = {{"type", "function"}, {"name", "get_weather"}};
  ok("/v1/responses", body);
  body["tool_choice"] = "required";
  body["parallel_tool_calls"] = false;
  ok("/v1/responses", body);
  body.erase("tools");
  body.erase("tool_choice");
  body.erase("parallel_tool_calls");
  body["text"] = {{"format", {{"type", "json_schema"}, {"name", "reply"}, {"strict", true},
                              {"schema", {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}}}}}};
  ok("/v1/responses", body);
  ASSERT_EQ(backend_.specs.size(), 3u);
  EXPECT_EQ(backend_.specs[0].kind, grammar::GrammarSpec::Kind::kToolCalls);
  ASSERT_EQ(backend_.specs[0].tools.size(), 1u);
  EXPECT_EQ(backend_.specs[0].tools[0].name, "get_weather");
  EXPECT_EQ(backend_.specs[1].tools.size(), 2u);
  EXPECT_FALSE(backend_.specs[1].parallel_tool_calls);
  EXPECT_EQ(backend_.specs[2].kind, grammar::GrammarSpec::Kind::kJsonSchema);
  EXPECT_EQ(backend_.specs[2].schema["properties"]["a"]["type"], "integer");
}

TEST_F(ResponsesTest, StoreGetDeleteAndPreviousResponseId) {
  backend_.script = "Paris.";
  start();
  json first = ok("/v1/responses", {{"instructions", "Geography."}, {"input", "Capital of France?"}});
  const std::string id = first["id"];
  auto got = client_->Get(("/v1/responses/" + id).c_str());
  ASSERT_EQ(got->status, 200);
  EXPECT_EQ(json::parse(got->body), first);

  // The continuation sees the earlier turn and its answer; not its instructions.
  ok("/v1/responses", {{"previous_response_id", id}, {"input", "And Italy?"}});
  EXPECT_EQ(messages_seen(), json::parse(R"([{"role": "user", "content": "Capital of France?"},
      {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}])"));

  auto del = client_->Delete(("/v1/responses/" + id).c_str());
  ASSERT_EQ(del->status, 200);
  EXPECT_EQ(json::parse(del->body), json({{"id", id}, {"object", "response"}, {"deleted", true}}));
  expect_error(client_->Get(("/v1/responses/" + id).c_str()), 404, "", "not found");
  expect_error(client_->Delete(("/v1/responses/" + id).c_str()), 404, "");
  expect_error(post("/v1/responses", {{"previous_response_id", id}, {"input", "x"}}), 404, "previous_response_id");

  // store false: nothing kept.
  json unstored = ok("/v1/responses", {{"input", "x"}, {"store", false}});
  EXPECT_EQ(unstored["store"], false);
  EXPECT_EQ(client_->Get(("/v1/responses/" + unstored["id"].get<std::string>()).c_str())->status, 404);
  // Streamed responses are stored too, as the stream's final response.
  auto frames = stream("/v1/responses", {{"input", "x"}});
  const json& final_response = frames.back().data["response"];
  auto streamed = client_->Get(("/v1/responses/" + final_response["id"].get<std::string>()).c_str());
  ASSERT_EQ(streamed->status, 200);
  EXPECT_EQ(json::parse(streamed->body)["output"], final_response["output"]);
}

TEST_F(ResponsesTest, StoreEvictsTheOldestPastItsCount) {
  backend_.script = "ok";
  ServerOptions o;
  o.responses_store_max_count = 2;
  start(o);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(ok("/v1/responses", {{"input", "x"}})["id"]);
  EXPECT_EQ(client_->Get(("/v1/responses/" + ids[0]).c_str())->status, 404);
  EXPECT_EQ(client_->Get(("/v1/responses/" + ids[1]).c_str())->status, 200);
  EXPECT_EQ(client_->Get(("/v1/responses/" + ids[2]).c_str())->status, 200);
}

TEST(ResponseStore, BoundsCountAndBytesOldestFirst) {
  auto entry = [](size_t n) { return StoredResponse{json(std::string(n, 'x')), json::array()}; };
  // Each entry costs its text: n + 2 quotes + "[]" = n + 4 bytes.
  ResponseStore store(10, 100);
  EXPECT_TRUE(store.put("a", entry(40)));
  EXPECT_TRUE(store.put("b", entry(40)));
  EXPECT_EQ(store.bytes(), 88u);
  EXPECT_TRUE(store.put("c", entry(40)));  // 132 > 100: "a" goes
  EXPECT_FALSE(store.get("a"));
  EXPECT_TRUE(store.get("b") && store.get("c"));
  EXPECT_EQ(store.size(), 2u);
  EXPECT_FALSE(store.put("huge", entry(200))) << "larger than the whole bound: not stored";
  EXPECT_EQ(store.size(), 2u);
  EXPECT_TRUE(store.erase("b"));
  EXPECT_FALSE(store.erase("b"));
  EXPECT_EQ(store.bytes(), 44u);
  ResponseStore none(0, 100);
  EXPECT_FALSE(none.put("a", entry(1)));
}

TEST_F(ResponsesTest, WhatCodexSendsIsAccepted) {
  backend_.template_source = kHermesTemplate;
  backend_.script = "Done.";
  start();
  json body = json::parse(R"({"model": "tiny", "instructions": null,
      "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}],
      "tools": [{"type": "function", "name": "shell", "description": "Runs a command", "strict": false,
                 "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}},
                                "required": ["command"], "additionalProperties": false}},
                {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
                 "tools": [{"type": "function", "name": "close_agent", "strict": false,
                            "parameters": {"type": "object", "properties": {}}}]}],
      "tool_choice": "auto", "parallel_tool_calls": false, "reasoning": {"effort": "medium", "summary": "auto"},
      "store": false, "stream": true, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0197-abc",
      "client_metadata": {"session": "s1"}, "text": {"verbosity": "medium"}})");
  auto frames = stream("/v1/responses", body);
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames.back().event, "response.completed");
  EXPECT_EQ(frames.back().data["response"]["output"][0]["content"][0]["text"], "Done.");
  EXPECT_EQ(messages_seen()[0], json({{"role", "system"}, {"content", "You are Codex."}}));
  // A namespace's function tools are offered under their own names.
  std::lock_guard<std::mutex> lock(backend_.seen_mutex);
  ASSERT_EQ(backend_.last_tools.size(), 2u);
  EXPECT_EQ(backend_.last_tools[1]["function"]["name"], "close_agent");
}

TEST_F(ResponsesTest, RefusalsNameTheParameter) {
  start();
  auto with = [](const char* key, json value) {
    json b = {{"input", "hi"}, {"max_output_tokens", 2}};
    b[key] = std::move(value);
    return b;
  };
  for (const char* tool : {"file_search", "code_interpreter", "computer_use_preview",
                           "mcp", "image_generation", "local_shell", "custom"})
    expect_error(post("/v1/responses", with("tools", json::array({{{"type", tool}, {"name", "x"}}}))), 400, "tools[0].type", tool);
  // Codex's default web_search tool is not offered to the model (no search
  // here), so its request is served; forcing it is refused.
  auto r = post("/v1/responses", with("tools", json::array({{{"type", "web_search"}}})));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  {
    std::lock_guard<std::mutex> lock(backend_.seen_mutex);
    EXPECT_TRUE(backend_.last_tools.empty()) << backend_.last_tools.dump();
  }
  json forced = with("tools", json::array({{{"type", "web_search"}}}));
  forced["tool_choice"] = {{"type", "web_search"}};
  expect_error(post("/v1/responses", forced), 400, "tool_choice.type");
  expect_error(post("/v1/responses", with("background", true)), 400, "background");
  expect_error(post("/v1/responses", with("include", {"reasoning.encrypted_content", "message.output_text.logprobs"})), 400,
               "include[1]");
  expect_error(post("/v1/responses", with("conversation", "conv_1")), 400, "conversation");
  expect_error(post("/v1/responses", with("truncation", "auto")), 400, "truncation");
  expect_error(post("/v1/responses", with("top_logprobs", 5)), 400, "top_logprobs");
  expect_error(post("/v1/responses", with("bogus", 1)), 400, "bogus");
  expect_error(post("/v1/responses", with("input", json::parse(R"([{"type": "item_reference", "id": "msg_1"}])"))), 400,
               "input[0].type");
  expect_error(post("/v1/responses", with("input", json::parse(R"([{"role": "user", "content": [
      {"type": "input_image", "image_url": "https://x/y.png"}]}])"))), 400, "input[0].content[0].type");
  expect_error(post("/v1/responses", with("text", {{"format", {{"type", "json_schema"}}}})), 400, "text.format.schema");
  expect_error(post("/v1/responses", with("tool_choice", "required")), 400, "tool_choice");
  expect_error(post("/v1/responses", {{"max_output_tokens", 2}}), 400, "input");
  expect_error(post("/v1/responses", with("model", "gpt-5")), 404, "model");
  expect_error(client_->Get("/v1/responses/resp_missing"), 404, "", "resp_missing");
  EXPECT_EQ(ok("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 1}})["object"], "response");
}

// null for an optional field means absent, as on chat completions.
TEST_F(ResponsesTest, NullOptionalFieldsMeanAbsent) {
  start();
  for (const char* f : {"instructions", "tools", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "text",
                        "reasoning", "store", "previous_response_id", "metadata", "user", "stream"}) {
    json body = {{"input", "hi"}, {"max_output_tokens", 5}};
    body[f] = nullptr;
    auto r = post("/v1/responses", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << f << ": null -> " << r->body;
  }
}

}  // namespace
}  // namespace shardlm::server
