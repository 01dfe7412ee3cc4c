// The request surface of issue 11 through the real HTTP server over a
// scripted backend: tool calls (whole and streamed), tool_choice,
// parallel_tool_calls, tool messages, reasoning, logit_bias, cached tokens,
// generation_config defaults, CORS, and refused parameters.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "server/http_server.h"

namespace shardlm::server {
namespace {

using testing::FakeBackend;
using json = nlohmann::json;

const char* kHermesTemplate = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>";
const std::string kCallScript =
    "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

json weather_tools() {
  return json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}])");
}

class ApiSurfaceTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.port = 0;
    options.served_model_names = {"tiny"};
    backend_.pace = std::chrono::milliseconds(0);
    server_ = std::make_unique<HttpServer>(backend_, options);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    if (server_) server_->stop(std::chrono::milliseconds(0));
    if (thread_.joinable()) thread_.join();
  }
  httplib::Result post(const std::string& path, const json& body, httplib::Headers headers = {}) {
    return client_->Post(path.c_str(), headers, body.dump(), "application/json");
  }
  json ok(const json& body, const std::string& path = "/v1/chat/completions") {
    auto r = post(path, body);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  void expect_400(const json& body, const std::string& param, const std::string& path = "/v1/chat/completions") {
    auto r = post(path, body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << body.dump() << " -> " << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], param) << r->body;
  }
  // The data: payloads of a streamed answer, [DONE] excluded.
  std::vector<json> stream(json body) {
    body["stream"] = true;
    auto r = post("/v1/chat/completions", body);
    std::vector<json> out;
    EXPECT_TRUE(r);
    if (!r) return out;
    EXPECT_EQ(r->status, 200) << r->body;
    std::istringstream in(r->body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
      out.push_back(json::parse(line.substr(6)));
    }
    return out;
  }
  static json chat(const std::string& text = "hi") {
    return {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 200}};
  }

  FakeBackend backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(ApiSurfaceTest, HermesToolCallNonStreaming) {
  backend_.template_source = kHermesTemplate;
  backend_.script = kCallScript;
  start();
  json body = chat("Weather in Paris?");
  body["tools"] = weather_tools();
  json r = ok(body);
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["content"], "Checking.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["function"]["name"], "get_weather");
  ASSERT_TRUE(call["function"]["arguments"].is_string());
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(backend_.last_tools, weather_tools());  // rendered for the model
}

TEST_F(ApiSurfaceTest, HermesToolCallStreamsOpenAIDeltas) {
  backend_.template_source = kHermesTemplate;
  backend_.script = kCallScript;
  start();
  json body = chat();
  body["tools"] = weather_tools();
  std::vector<json> chunks = stream(body);
  std::string content, arguments, finish;
  int n_first = 0;
  for (const json& c : chunks) {
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) {
      for (const json& t : delta["tool_calls"]) {
        EXPECT_EQ(t["index"], 0);
        if (t.contains("id")) {
          ++n_first;
          EXPECT_EQ(t["type"], "function");
          EXPECT_EQ(t["function"]["name"], "get_weather");
          EXPECT_EQ(arguments, "");  // the first delta comes first
        } else {
          EXPECT_FALSE(t["function"].contains("name"));
        }
        arguments += t["function"]["arguments"].get<std::string>();
      }
    }
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(n_first, 1);
  EXPECT_EQ(json::parse(arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(finish, "tool_calls");
  EXPECT_GT(chunks.size(), 3u);  // one byte per token: the arguments came in fragments
}

TEST_F(ApiSurfaceTest, ToolChoiceNoneAutoRequiredNamedAndParallel) {
  backend_.template_source = kHermesTemplate;
  backend_.script = kCallScript + "<tool_call>{\"name\": \"get_time\"}</tool_call>";
  start();
  json body = chat();
  body["tools"] = weather_tools();
  EXPECT_EQ(ok(body)["choices"][0]["message"]["tool_calls"].size(), 2u);  // auto is the default
  body["parallel_tool_calls"] = false;
  EXPECT_EQ(ok(body)["choices"][0]["message"]["tool_calls"].size(), 1u);
  body.erase("parallel_tool_calls");
  body["tool_choice"] = "none";
  json none = ok(body);
  EXPECT_FALSE(none["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(none["choices"][0]["message"]["content"], backend_.script);  // not parsed
  EXPECT_TRUE(backend_.last_tools.is_null());                            // not rendered
  EXPECT_EQ(none["choices"][0]["finish_reason"], "stop");
  body["tool_choice"] = "required";
  expect_400(body, "tool_choice");  // this fake backend has no grammar engine: refused, not ignored
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  expect_400(body, "tool_choice");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  expect_400(body, "tool_choice");
  body["tool_choice"] = "sometimes";
  expect_400(body, "tool_choice");
  body.erase("tool_choice");
  body["tools"] = json::array({{{"type", "retrieval"}}});
  expect_400(body, "tools[0].type");
}

TEST_F(ApiSurfaceTest, ToolsNeedAParserFormat) {
  start();  // the template writes no tool calls and no --tool-call-parser
  json body = chat();
  body["tools"] = weather_tools();
  expect_400(body, "tools");
  body["tool_choice"] = "none";
  ok(body);
  server_->stop(std::chrono::milliseconds(0));
  thread_.join();
  ServerOptions o;
  o.api.tool_call_parser = "llama3_json";
  backend_.script = "{\"name\": \"get_time\", \"parameters\": {}}";
  start(o);
  body.erase("tool_choice");
  json r = ok(body);
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_null());
}

// --max-logprobs: top_logprobs (chat) and logprobs (completions) above it are
// refused naming the parameter and the flag; at it they are served.
TEST_F(ApiSurfaceTest, MaxLogprobsBoundsTopLogprobs) {
  ServerOptions o;
  o.limits.max_top_logprobs = 2;
  start(o);
  json body = chat();
  body["max_tokens"] = 3;
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  EXPECT_TRUE(ok(body)["choices"][0].contains("logprobs"));
  body["top_logprobs"] = 3;
  auto bad = post("/v1/chat/completions", body);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "top_logprobs") << bad->body;
  EXPECT_NE(bad->body.find("--max-logprobs"), std::string::npos) << bad->body;
  expect_400({{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}, {"logprobs", 3}}, "logprobs", "/v1/completions");
}

// serve's request limits (--max-n, --max-stop-strings, --max-stop-length,
// --max-prompts, --max-logit-bias): one past each is refused naming the
// parameter and the flag; at each, the request is served.
TEST_F(ApiSurfaceTest, RequestLimitsAreTheFlagsAndTheirErrorsNameThem) {
  ServerOptions o;
  o.limits.max_n = 2;
  o.limits.max_stop_strings = 2;
  o.limits.max_stop_length = 4;
  o.limits.max_prompts = 2;
  o.limits.max_logit_bias = 2;
  start(o);
  struct Case {
    const char* param;
    json at, over;
    const char* flag;
    const char* path;
  } cases[] = {
      {"n", 2, 3, "--max-n", "/v1/chat/completions"},
      {"stop", json::array({"ab", "cd"}), json::array({"ab", "cd", "ef"}), "--max-stop-strings", "/v1/chat/completions"},
      {"stop", json::array({"abcd"}), json::array({"abcde"}), "--max-stop-length", "/v1/chat/completions"},
      {"logit_bias", {{"1", 1}, {"2", 1}}, {{"1", 1}, {"2", 1}, {"3", 1}}, "--max-logit-bias", "/v1/chat/completions"},
      {"prompt", json::array({"a", "b"}), json::array({"a", "b", "c"}), "--max-prompts", "/v1/completions"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    json body = std::string(c.path) == "/v1/completions" ? json{{"model", "tiny"}, {"max_tokens", 2}} : chat();
    body[c.param] = c.at;
    auto good = post(c.path, body);
    ASSERT_TRUE(good);
    EXPECT_EQ(good->status, 200) << good->body;
    body[c.param] = c.over;
    auto bad = post(c.path, body);
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400) << bad->body;
    EXPECT_EQ(json::parse(bad->body)["error"]["param"], c.param) << bad->body;
    EXPECT_NE(bad->body.find(c.flag), std::string::npos) << bad->body;
  }
}

TEST_F(ApiSurfaceTest, ToolCallHistoryRendersLikeVllm) {
  backend_.template_source = kHermesTemplate;
  start();
  json body = chat();
  body["tools"] = weather_tools();
  body["messages"] = json::parse(R"([{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "cold"}])");
  ok(body);
  const json& m = backend_.last_messages;
  EXPECT_EQ(m[1]["content"], "");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Oslo"}}));
  EXPECT_EQ(m[2]["role"], "tool");
  body["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  expect_400(body, "messages[1].tool_calls[0].function.arguments");
}

TEST_F(ApiSurfaceTest, Qwen3ReasoningWholeAndStreamed) {
  backend_.script = "<think>\nadd them</think>\n\nIt is 4.";
  ServerOptions o;
  o.api.reasoning_parser = "qwen3";
  start(o);
  json r = ok(chat());
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "\nadd them");
  EXPECT_EQ(r["choices"][0]["message"]["reasoning"], "\nadd them");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "\n\nIt is 4.");
  std::string reasoning, content;
  for (const json& c : stream(chat())) {
    const json& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      EXPECT_EQ(d["reasoning"], d["reasoning_content"]);
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "\nadd them");
  EXPECT_EQ(content, "\n\nIt is 4.");
}

TEST_F(ApiSurfaceTest, UnimplementedParametersAreRefusedByName) {
  start();
  for (const char* field : {"functions", "guided_json", "structured_outputs", "use_beam_search", "reasoning_effort",
                            "made_up_field", "echo", "suffix"}) {
    json body = chat();
    body[field] = json::array({1});
    expect_400(body, field);
  }
  json body = chat();
  body["priority"] = 1;
  expect_400(body, "priority");
  body["priority"] = 0;
  body["user"] = "someone";
  body["store"] = false;
  ok(body);
  json comp = {{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 2}, {"best_of", 2}};
  expect_400(comp, "best_of", "/v1/completions");
  comp["best_of"] = 1;
  comp["suffix"] = "tail";
  expect_400(comp, "suffix", "/v1/completions");
  comp.erase("suffix");
  comp["tools"] = weather_tools();
  expect_400(comp, "tools", "/v1/completions");
  comp.erase("tools");
  ok(comp, "/v1/completions");
}

// vLLM's cache_salt reaches the engine (whose scheduler keeps salted prefix
// caches apart: tests/sched); a salt that is not a non-empty string is a 400.
TEST_F(ApiSurfaceTest, CacheSaltIsValidatedAndPassedOn) {
  start();
  json body = chat();
  body["cache_salt"] = "tenant-7";
  ok(body);
  EXPECT_EQ(backend_.last_params.cache_salt, "tenant-7");
  json comp = body;
  comp.erase("messages");
  comp["prompt"] = "hi";
  ok(comp, "/v1/completions");
  EXPECT_EQ(backend_.last_params.cache_salt, "tenant-7");
  body.erase("cache_salt");
  ok(body);
  EXPECT_EQ(backend_.last_params.cache_salt, "");
  for (json bad : {json(""), json(7), json::array(), json(std::string(2000, 's'))}) {
    body["cache_salt"] = bad;
    expect_400(body, "cache_salt");
  }
}

TEST_F(ApiSurfaceTest, LogitBiasIsValidatedAndPassedOn) {
  backend_.vocab = 300;
  start();
  json body = chat();
  body["logit_bias"] = {{"65", 100}, {"7", -100}, {"12", 0.5}};
  ok(body);
  std::vector<std::pair<int32_t, float>> bias = backend_.last_params.logit_bias;
  std::sort(bias.begin(), bias.end());
  ASSERT_EQ(bias.size(), 3u);
  EXPECT_EQ(bias[0], (std::pair<int32_t, float>{7, -100.0f}));
  EXPECT_EQ(bias[2], (std::pair<int32_t, float>{65, 100.0f}));
  for (json bad : {json{{"300", 1}}, json{{"-1", 1}}, json{{"x", 1}}, json{{"5", 101}}, json{{"5", "1"}}}) {
    body["logit_bias"] = bad;
    expect_400(body, "logit_bias");
  }
}

TEST_F(ApiSurfaceTest, UsageReportsCachedTokens) {
  backend_.cached = 3;
  start();
  json r = ok(chat());
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
  json body = chat();
  body["stream_options"] = {{"include_usage", true}};
  std::vector<json> chunks = stream(body);
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks.back()["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

TEST_F(ApiSurfaceTest, GenerationConfigDefaultsAndRequestValuesWin) {
  backend_.defaults.temperature = 0.6;
  backend_.defaults.top_k = 20;
  backend_.defaults.max_tokens = 7;
  start();
  json body = chat();
  body.erase("max_tokens");
  ok(body);
  EXPECT_DOUBLE_EQ(backend_.last_params.temperature, 0.6);
  EXPECT_EQ(backend_.last_params.top_k, 20);
  EXPECT_EQ(backend_.last_params.max_tokens, 7);
  body["temperature"] = 1.0;
  body["top_k"] = -1;
  ok(body);
  EXPECT_DOUBLE_EQ(backend_.last_params.temperature, 1.0);
  EXPECT_EQ(backend_.last_params.top_k, -1);
  server_->stop(std::chrono::milliseconds(0));
  thread_.join();
  ServerOptions o;
  o.api.generation_config = false;  // --generation-config vllm
  start(o);
  body.erase("temperature");
  ok(body);
  EXPECT_DOUBLE_EQ(backend_.last_params.temperature, 1.0);
}

TEST_F(ApiSurfaceTest, CorsPreflightAndAllowedOrigins) {
  ServerOptions o;
  o.allowed_origins = {"http://app.example"};
  o.api_key = "k";
  start(o);
  auto pre = client_->Options("/v1/chat/completions", {{"Origin", "http://app.example"},
                                                       {"Access-Control-Request-Method", "POST"},
                                                       {"Access-Control-Request-Headers", "authorization, content-type"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);  // answered without the API key, as browsers send it
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "authorization, content-type");
  auto bad = client_->Options("/v1/chat/completions", {{"Origin", "http://evil.example"}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 403);
  EXPECT_FALSE(bad->has_header("Access-Control-Allow-Origin"));
  auto r = post("/v1/chat/completions", chat(), {{"Origin", "http://app.example"}, {"Authorization", "Bearer k"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  auto none = post("/v1/chat/completions", chat(), {{"Authorization", "Bearer k"}});
  EXPECT_FALSE(none->has_header("Access-Control-Allow-Origin"));
}

// OpenAI and vLLM read null as absent: every optional field sent as null
// is answered as if it were not sent, never with a 400.
TEST_F(ApiSurfaceTest, NullOptionalFieldsMeanAbsent) {
  backend_.template_source = kHermesTemplate;
  backend_.accept_grammars = true;
  start();
  const char* common[] = {"stream", "stream_options", "n", "temperature", "top_p", "top_k", "min_p",
                          "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop",
                          "stop_token_ids", "ignore_eos", "skip_special_tokens", "logprobs", "min_tokens",
                          "logit_bias", "response_format", "structured_outputs", "guided_json", "guided_regex",
                          "guided_choice", "cache_salt", "user", "metadata", "store", "service_tier", "priority",
                          "functions", "function_call", "prediction", "reasoning_effort", "audio", "modalities"};
  const char* chat_only[] = {"tool_choice", "tools", "parallel_tool_calls", "top_logprobs", "max_completion_tokens",
                             "chat_template_kwargs", "add_generation_prompt"};
  const char* completions_only[] = {"echo", "best_of", "suffix", "max_tokens"};
  auto expect_null_ok = [&](json body, const char* field, const std::string& path) {
    body[field] = nullptr;
    auto r = post(path, body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << path << " " << field << ": null -> " << r->body;
  };
  for (const char* f : common) expect_null_ok(chat(), f, "/v1/chat/completions");
  for (const char* f : chat_only) expect_null_ok(chat(), f, "/v1/chat/completions");
  // tool_choice null with tools: "auto", tools rendered.
  json with_tools = chat();
  with_tools["tools"] = weather_tools();
  expect_null_ok(with_tools, "tool_choice", "/v1/chat/completions");
  EXPECT_EQ(backend_.last_tools, weather_tools());
  expect_null_ok(with_tools, "parallel_tool_calls", "/v1/chat/completions");
  const json completion = {{"prompt", "hi"}, {"max_tokens", 2}};
  for (const char* f : common) expect_null_ok(completion, f, "/v1/completions");
  for (const char* f : completions_only) expect_null_ok(completion, f, "/v1/completions");
  // Nested optional fields, as SDKs and agents fill them in.
  const json call = {{"id", "c1"}, {"index", nullptr}, {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", "{}"}}}};
  const json nested[] = {
      {{"stream", true}, {"stream_options", {{"include_usage", nullptr}, {"continuous_usage_stats", nullptr}}}},
      {{"messages", {{{"role", "user"}, {"content", "hi"}, {"name", nullptr}},
                     {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", {call}}, {"refusal", nullptr},
                      {"reasoning_content", nullptr}, {"audio", nullptr}, {"function_call", nullptr}},
                     {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}, {"name", nullptr}},
                     {{"role", "assistant"}, {"content", "x"}, {"tool_calls", nullptr}},
                     {{"role", "user"}, {"content", "y"}}}}},
      {{"tools", {{{"type", "function"},
                   {"function", {{"name", "f"}, {"description", nullptr}, {"strict", nullptr}, {"parameters", nullptr}}}}}}},
      {{"response_format", {{"type", "json_schema"},
                            {"json_schema", {{"name", "x"}, {"strict", nullptr}, {"description", nullptr},
                                             {"schema", {{"type", "object"}}}}}}}},
      {{"structured_outputs", {{"regex", nullptr}, {"choice", {"a", "b"}}}}},
  };
  for (const json& patch : nested) {
    json body = chat();
    body.update(patch);
    auto r = post("/v1/chat/completions", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << patch.dump() << " -> " << r->body;
  }
  // A null required field is still missing.
  expect_400({{"prompt", nullptr}}, "prompt", "/v1/completions");
  expect_400({{"messages", nullptr}}, "messages");
}

// vLLM's tokenizer endpoints: /tokenize's return_token_strs, a refused
// continue_final_message, GET /tokenizer_info; and a schema inside
// response_format json_object is refused, not ignored.
TEST_F(ApiSurfaceTest, TokenizerFieldsAndJsonObjectSchema) {
  backend_.vocab = 300;
  start();
  json t = ok({{"prompt", "hey"}, {"return_token_strs", true}}, "/tokenize");
  ASSERT_EQ(t["tokens"].size(), 3u);
  EXPECT_EQ(t["token_strs"], json({"h", "e", "y"}));
  EXPECT_FALSE(ok({{"prompt", "hey"}}, "/tokenize").contains("token_strs"));
  expect_400({{"prompt", "hey"}, {"return_token_strs", "yes"}}, "return_token_strs", "/tokenize");
  expect_400({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"continue_final_message", true}},
             "continue_final_message", "/tokenize");
  EXPECT_EQ(ok({{"prompt", "hey"}, {"continue_final_message", false}}, "/tokenize")["count"], 3);
  auto info = client_->Get("/tokenizer_info");
  ASSERT_TRUE(info);
  ASSERT_EQ(info->status, 200) << info->body;
  EXPECT_EQ(json::parse(info->body)["vocab_size"], 300);
  EXPECT_EQ(json::parse(info->body)["model_max_length"], backend_.max_model_len());
  json body = chat();
  body["response_format"] = {{"type", "json_object"}, {"schema", {{"type", "object"}}}};
  expect_400(body, "response_format.schema");
}

// Limits are named in their errors; a custom message role is refused with
// the accepted ones listed (shardlm validates roles before the template).
TEST_F(ApiSurfaceTest, ErrorsNameTheLimitAndTheAcceptedRoles) {
  backend_.vocab = 300;
  start();
  auto message_of = [&](const json& body, const std::string& param) {
    auto r = post("/v1/chat/completions", body);
    EXPECT_TRUE(r);
    if (!r) return std::string();
    EXPECT_EQ(r->status, 400) << r->body;
    json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["param"], param) << r->body;
    return e["message"].get<std::string>();
  };
  json body = chat();
  body["logit_bias"] = {{"300", 5}};
  EXPECT_NE(message_of(body, "logit_bias").find("the vocabulary has 300 tokens"), std::string::npos);
  body = chat();
  body["n"] = 1000;
  EXPECT_NE(message_of(body, "n").find("at most 16"), std::string::npos);
  body = chat();
  body["messages"] = {{{"role", "narrator"}, {"content", "x"}}};
  const std::string m = message_of(body, "messages[0].role");
  EXPECT_NE(m.find("'narrator'"), std::string::npos) << m;
  EXPECT_NE(m.find("system, user, assistant, tool, developer"), std::string::npos) << m;
}

// A forced tool call (tool_choice named or required) cut off by max_tokens:
// no tag text in content, and tool_calls empty (cut before the name) or the
// call as far as it got; whole and streamed alike. A malformed call block in
// auto mode is content, never a 5xx.
TEST_F(ApiSurfaceTest, ForcedToolCallCutShortLeaksNoTagText) {
  backend_.template_source = kHermesTemplate;
  backend_.accept_grammars = true;
  backend_.script = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  start();
  auto forced = [&](int max_tokens, const json& choice) {
    json body = chat();
    body["tools"] = weather_tools();
    body["tool_choice"] = choice;
    body["max_tokens"] = max_tokens;
    return body;
  };
  const json named = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  for (const json& choice : {named, json("required")}) {
    for (int cut : {3, 15, 40}) {  // inside the tag, before the name is whole, inside the arguments
      json m = ok(forced(cut, choice))["choices"][0];
      EXPECT_EQ(m["finish_reason"], "length");
      const json& content = m["message"]["content"];
      EXPECT_TRUE(content.is_null() || content == "") << cut << ": " << m.dump();
      if (cut == 40) {
        ASSERT_EQ(m["message"]["tool_calls"].size(), 1u) << m.dump();
        EXPECT_EQ(m["message"]["tool_calls"][0]["function"]["name"], "get_weather");
      } else {
        EXPECT_FALSE(m["message"].contains("tool_calls")) << m.dump();
      }
      std::string streamed;
      for (const json& c : stream(forced(cut, choice)))
        streamed += c["choices"][0]["delta"].value("content", "");
      EXPECT_EQ(streamed, "") << cut;
    }
  }
  // Auto: a broken block is returned as content, whole and streamed, with a 200.
  backend_.script = "<tool_call>\n{\"nam\": 1]]\n</tool_call> done";
  json body = chat();
  body["tools"] = weather_tools();
  json m = ok(body)["choices"][0]["message"];
  EXPECT_EQ(m["content"], backend_.script);
  std::string streamed;
  for (const json& c : stream(body)) streamed += c["choices"][0]["delta"].value("content", "");
  EXPECT_EQ(streamed, backend_.script);
}

}  // namespace
}  // namespace shardlm::server
