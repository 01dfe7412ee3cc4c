#include "server/http_server.h"

#include <gtest/gtest.h>

#include <map>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fake_backend.h"
#include "support/process.h"

namespace shardlm::server {
namespace {

using testing::FakeBackend;
using json = nlohmann::json;

class HttpServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}, size_t max_body_bytes = 64 * 1024) {
    options.port = 0;
    if (options.served_model_names.empty()) options.served_model_names = {"tiny"};
    options.version = "9.9.9";
    options.max_body_bytes = max_body_bytes;
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
  // Asserts an OpenAI-shaped error with this status, naming `param` when given.
  json expect_error(const httplib::Result& r, int status, const std::string& param = "", const std::string& needle = "") {
    EXPECT_TRUE(r) << "no response";
    if (!r) return {};
    EXPECT_EQ(r->status, status) << r->body;
    json body = json::parse(r->body);
    EXPECT_TRUE(body["error"]["message"].is_string());
    EXPECT_TRUE(body["error"]["type"].is_string());
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_TRUE(body["error"].contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(body["error"]["param"], param) << r->body;
    }
    if (!needle.empty()) {
      EXPECT_NE(body["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
    }
    return body;
  }
  json chat(int max_tokens) {
    return {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", max_tokens}};
  }

  FakeBackend backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HttpServerTest, ModelsHealthVersion) {
  start();
  auto models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  json m = json::parse(models->body);
  EXPECT_EQ(m["object"], "list");
  EXPECT_EQ(m["data"][0]["id"], "tiny");
  EXPECT_EQ(m["data"][0]["max_model_len"], 256);
  EXPECT_EQ(client_->Get("/health")->status, 200);
  EXPECT_EQ(json::parse(client_->Get("/version")->body)["version"], "9.9.9");
  EXPECT_EQ(client_->Get("/metrics")->status, 200);
}

// Burst admission's front half (engine/arrivals.h): a POST is announced
// before a worker parses it and is still announced when it reaches the
// backend, until its handler waits for output; GETs are not announced.
TEST_F(HttpServerTest, PostsAreAnnouncedToTheBackendUntilTheyWaitForOutput) {
  backend_.arrivals_board = std::make_shared<Arrivals>();
  start();
  ASSERT_EQ(client_->Get("/v1/models")->status, 200);
  ASSERT_EQ(client_->Get("/health")->status, 200);
  EXPECT_EQ(backend_.arrivals_board->n_announced(), 0);
  auto r = post("/v1/chat/completions", chat(3));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // Two prompts: both are submitted before the handler waits, so both see
  // their request announced.
  r = post("/v1/completions", {{"model", "tiny"}, {"prompt", {"ab", "cd"}}, {"max_tokens", 2}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  {
    std::lock_guard<std::mutex> lock(backend_.seen_mutex);
    EXPECT_EQ(backend_.pending_at_submit, (std::vector<int64_t>{1, 1, 1}));
  }
  EXPECT_EQ(backend_.arrivals_board->n_announced(), 2);
  EXPECT_EQ(backend_.arrivals_board->n_pending(), 0);
}

TEST_F(HttpServerTest, ChatCompletionHasOpenAIShape) {
  start();
  auto r = post("/v1/chat/completions", chat(5));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json body = json::parse(r->body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_TRUE(body["created"].is_number_integer());
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "abcde");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  // Prompt "user:hi\nassistant:" is 18 bytes = 18 fake tokens.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 18);
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 23);
}

TEST_F(HttpServerTest, CompletionsAcceptStringsListsAndTokenIds) {
  start();
  auto r = post("/v1/completions", {{"model", "tiny"}, {"prompt", {"ab", "cde"}}, {"max_tokens", 3}, {"n", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = json::parse(r->body);
  EXPECT_EQ(body["object"], "text_completion");
  ASSERT_EQ(body["choices"].size(), 4u);  // 2 prompts x n=2
  for (int i = 0; i < 4; ++i) EXPECT_EQ(body["choices"][i]["index"], i);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  auto ids = post("/v1/completions", {{"prompt", {104, 105}}, {"max_tokens", 2}, {"echo", true}});
  ASSERT_EQ(ids->status, 200) << ids->body;
  json b2 = json::parse(ids->body);
  EXPECT_EQ(b2["choices"][0]["text"], "hiab");
}

// echo with logprobs (OpenAI's legacy shape): the logprobs object covers the
// prompt's tokens first (the first with null logprob and null top), then the
// generated ones, text offsets counted from the start of the echoed prompt.
// The backend is asked for the prompt's logprobs with the same top-k.
TEST_F(HttpServerTest, CompletionsEchoWithLogprobsCoversThePromptFirst) {
  start();
  auto r = post("/v1/completions", {{"prompt", {104, 105, 106}}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(r->status, 200) << r->body;
  {
    std::lock_guard<std::mutex> lock(backend_.seen_mutex);
    EXPECT_EQ(backend_.last_params.prompt_logprobs, 1);
    EXPECT_EQ(backend_.last_params.logprobs, 1);
  }
  json c = json::parse(r->body)["choices"][0];
  EXPECT_EQ(c["text"], "hijab");
  EXPECT_FALSE(c.contains("prompt_logprobs")) << c.dump();  // not asked for
  const json& lp = c["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"h", "i", "j", "a", "b"})) << lp.dump();
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3, 4})) << lp.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][1].get<double>(), -0.25);  // the fake's prompt token 1
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][2].get<double>(), -0.5);
  EXPECT_DOUBLE_EQ(lp["token_logprobs"][3].get<double>(), -0.5);   // generated
  // Top 1 plus the token itself, as for generated tokens.
  EXPECT_EQ(lp["top_logprobs"][1].size(), 2u) << lp.dump();
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][1]["A"].get<double>(), -0.1f);
  EXPECT_DOUBLE_EQ(lp["top_logprobs"][1]["i"].get<double>(), -0.25);
  EXPECT_TRUE(lp["top_logprobs"][3].contains("a")) << lp.dump();
  // Streamed with n > 1, a sibling's first chunk may precede the prompt's
  // logprobs: refused naming echo.
  expect_error(post("/v1/completions", {{"prompt", "hi"}, {"echo", true}, {"logprobs", 0}, {"n", 2}, {"stream", true}}),
               400, "echo");
}

// Streamed echo, as vLLM streams it: each choice's first chunk opens with its
// prompt's text; with logprobs, that chunk's logprobs cover the prompt's
// tokens first (the first unscored), and the whole stream adds up to the
// non-streamed response.
TEST_F(HttpServerTest, CompletionsStreamEchoesThePromptInTheFirstChunk) {
  start();
  auto stream_of = [&](json body) {
    body["stream"] = true;
    auto r = client_->Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    std::vector<json> chunks;
    size_t pos = 0;
    while (r && (pos = r->body.find("data: ", pos)) != std::string::npos) {
      const size_t end = r->body.find("\n\n", pos);
      const std::string payload = r->body.substr(pos + 6, end - pos - 6);
      pos = end;
      if (payload != "[DONE]") chunks.push_back(json::parse(payload));
    }
    return chunks;
  };
  // Two prompts, n = 2: every choice's text starts with its own prompt, once.
  std::map<int, std::string> texts;
  for (const json& c : stream_of({{"prompt", {"ab", "cde"}}, {"max_tokens", 3}, {"n", 2}, {"echo", true}}))
    texts[c["choices"][0]["index"].get<int>()] += c["choices"][0]["text"].get<std::string>();
  ASSERT_EQ(texts.size(), 4u);
  EXPECT_EQ(texts[0], "ababc");
  EXPECT_EQ(texts[1], "ababc");
  EXPECT_EQ(texts[2], "cdeabc");
  EXPECT_EQ(texts[3], "cdeabc");
  // With logprobs: the first chunk carrying text holds the prompt's tokens, then its own.
  const std::vector<json> chunks =
      stream_of({{"prompt", {104, 105, 106}}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  std::string text;
  json tokens = json::array(), token_logprobs = json::array();
  for (const json& c : chunks) {
    const json& choice = c["choices"][0];
    text += choice["text"].get<std::string>();
    if (choice["logprobs"].is_null()) continue;
    for (const json& t : choice["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& t : choice["logprobs"]["token_logprobs"]) token_logprobs.push_back(t);
  }
  EXPECT_EQ(text, "hijab");
  EXPECT_EQ(tokens, json({"h", "i", "j", "a", "b"}));
  ASSERT_EQ(token_logprobs.size(), 5u);
  EXPECT_TRUE(token_logprobs[0].is_null());
  EXPECT_DOUBLE_EQ(token_logprobs[1].get<double>(), -0.25);  // the fake's prompt token 1
  EXPECT_DOUBLE_EQ(token_logprobs[3].get<double>(), -0.5);   // generated
  ASSERT_FALSE(chunks.empty());
  EXPECT_EQ(chunks[0]["choices"][0]["text"].get<std::string>().rfind("hij", 0), 0u) << chunks[0].dump();
}

// vLLM's prompt_logprobs: per choice on completions (every choice of a
// prompt carries its prompt's list), beside the choices on chat; null for
// the first token, then {token id: {logprob, rank, decoded_token}} holding
// the token itself first and the top-k with ranks 1..k.
TEST_F(HttpServerTest, PromptLogprobsHaveVllmShape) {
  start();
  auto r = post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 1}, {"n", 2}, {"prompt_logprobs", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = json::parse(r->body);
  ASSERT_EQ(body["choices"].size(), 2u);
  for (const json& c : body["choices"]) {
    const json& p = c["prompt_logprobs"];
    ASSERT_EQ(p.size(), 3u) << c.dump();
    EXPECT_TRUE(p[0].is_null());
    ASSERT_EQ(p[1].size(), 3u) << p.dump();  // 'b' (rank 2 in the fake) and the top 2, 'A' and 'B'
    EXPECT_DOUBLE_EQ(p[1]["98"]["logprob"].get<double>(), -0.25);
    EXPECT_EQ(p[1]["98"]["rank"], 2);
    EXPECT_EQ(p[1]["98"]["decoded_token"], "b");
    EXPECT_EQ(p[1]["65"]["rank"], 1);
    EXPECT_EQ(p[1]["65"]["decoded_token"], "A");
    EXPECT_EQ(p[1]["66"]["rank"], 2);
    EXPECT_EQ(p[2]["99"]["rank"], 3);
    EXPECT_TRUE(c["logprobs"].is_null());  // prompt_logprobs alone asks for no generation logprobs
  }
  // The prompt token comes first in its dict, as vLLM writes it.
  EXPECT_EQ(nlohmann::ordered_json::parse(r->body)["choices"][0]["prompt_logprobs"][1].begin().key(), "98");
  // prompt_logprobs 0: the token alone.
  r = post("/v1/completions", {{"prompt", "ab"}, {"max_tokens", 1}, {"prompt_logprobs", 0}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["prompt_logprobs"][1].size(), 1u) << r->body;
  // Chat: one list beside the choices, over the rendered prompt.
  json req = chat(2);
  req["prompt_logprobs"] = 1;
  r = post("/v1/chat/completions", req);
  ASSERT_EQ(r->status, 200) << r->body;
  body = json::parse(r->body);
  ASSERT_EQ(body["prompt_logprobs"].size(), 18u) << r->body;  // "user:hi\nassistant:"
  EXPECT_TRUE(body["prompt_logprobs"][0].is_null());
  EXPECT_EQ(body["prompt_logprobs"][1]["115"]["decoded_token"], "s");
  EXPECT_FALSE(body["choices"][0].contains("prompt_logprobs"));
}

// prompt_logprobs is bounded by --max-logprobs and must be a non-negative
// integer; vLLM refuses it when streaming. Each a 400 naming it.
TEST_F(HttpServerTest, PromptLogprobsOutOfRangeIsA400NamingIt) {
  ServerOptions o;
  o.limits.max_top_logprobs = 3;
  start(o);
  const json base = {{"prompt", "ab"}, {"max_tokens", 1}};
  auto with = [&](json v) {
    json b = base;
    b["prompt_logprobs"] = std::move(v);
    return b;
  };
  expect_error(post("/v1/completions", with(4)), 400, "prompt_logprobs", "--max-logprobs");
  expect_error(post("/v1/completions", with(-1)), 400, "prompt_logprobs");
  expect_error(post("/v1/completions", with("2")), 400, "prompt_logprobs", "integer");
  expect_error(post("/v1/completions", with(true)), 400, "prompt_logprobs");
  expect_error(post("/v1/completions", with(1.5)), 400, "prompt_logprobs");
  json stream = with(1);
  stream["stream"] = true;
  expect_error(post("/v1/completions", stream), 400, "prompt_logprobs", "stream");
  json c = chat(1);
  c["prompt_logprobs"] = 4;
  expect_error(post("/v1/chat/completions", c), 400, "prompt_logprobs", "--max-logprobs");
  EXPECT_EQ(post("/v1/completions", with(3))->status, 200);
  EXPECT_EQ(post("/v1/completions", with(nullptr))->status, 200);  // null: absent
}

TEST_F(HttpServerTest, StreamingSendsChunksUsageAndDone) {
  start();
  json req = chat(4);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  std::string raw;
  auto r = client_->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  raw = r->body;
  std::vector<json> chunks;
  size_t pos = 0;
  bool done = false;
  while ((pos = raw.find("data: ", pos)) != std::string::npos) {
    size_t end = raw.find("\n\n", pos);
    std::string payload = raw.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    chunks.push_back(json::parse(payload));
  }
  EXPECT_TRUE(done);
  ASSERT_GE(chunks.size(), 5u);
  EXPECT_EQ(chunks[0]["object"], "chat.completion.chunk");
  // The first chunk is role-only, as OpenAI and vLLM send it; no later one has a role.
  EXPECT_EQ(chunks[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(chunks[0]["choices"][0]["finish_reason"].is_null());
  for (size_t i = 1; i + 1 < chunks.size(); ++i) EXPECT_FALSE(chunks[i]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "a");
  std::string text;
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    EXPECT_TRUE(chunks[i]["usage"].is_null());
    text += chunks[i]["choices"][0]["delta"].value("content", "");
  }
  EXPECT_EQ(text, "abcd");
  EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(chunks.back()["choices"].empty());
  EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 4);
}

// vLLM's stream_options.continuous_usage_stats: usage on every chunk, the
// choice's completion tokens so far, then the final usage chunk.
TEST_F(HttpServerTest, ContinuousUsageStatsOnEveryChunk) {
  start();
  json req = chat(3);
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
  auto r = client_->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::vector<json> chunks;
  size_t pos = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    size_t end = r->body.find("\n\n", pos);
    std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload != "[DONE]") chunks.push_back(json::parse(payload));
  }
  ASSERT_EQ(chunks.size(), 5u);  // role, 3 tokens, usage
  for (size_t i = 0; i < chunks.size(); ++i) {
    ASSERT_TRUE(chunks[i]["usage"].is_object()) << i << ": " << chunks[i].dump();
    EXPECT_EQ(chunks[i]["usage"]["prompt_tokens"], 18);
    EXPECT_EQ(chunks[i]["usage"]["completion_tokens"], std::min<int>(static_cast<int>(i), 3)) << i;
  }
  EXPECT_TRUE(chunks.back()["choices"].empty());
  req["stream_options"] = {{"continuous_usage_stats", true}};
  expect_error(post("/v1/chat/completions", req), 400, "stream_options.continuous_usage_stats");
  req["stream_options"] = {{"include_usage", true}, {"other", true}};
  expect_error(post("/v1/chat/completions", req), 400, "stream_options.other");
}

TEST_F(HttpServerTest, CompletionsStreamHasNoRoleChunk) {
  start();
  auto r = client_->Post("/v1/completions",
                         json({{"prompt", "hi"}, {"max_tokens", 3}, {"stream", true}}).dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  size_t pos = 0;
  int n = 0;
  while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
    size_t end = r->body.find("\n\n", pos);
    std::string payload = r->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") continue;
    json c = json::parse(payload);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_FALSE(c["choices"][0].contains("delta"));
    if (n++ == 0) EXPECT_FALSE(c["choices"][0]["text"].get<std::string>().empty());  // the first chunk is a token
    text += c["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "abc");
}

TEST_F(HttpServerTest, InvalidValuesAre400NamingTheParameter) {
  start();
  auto with = [&](const char* key, json value) {
    json r = chat(4);
    r[key] = value;
    return post("/v1/chat/completions", r);
  };
  expect_error(with("temperature", 2.5), 400, "temperature", "[0, 2]");
  expect_error(with("temperature", -0.1), 400, "temperature");
  expect_error(with("top_p", 0), 400, "top_p", "(0, 1]");
  expect_error(with("top_p", 1.5), 400, "top_p");
  expect_error(with("max_tokens", 0), 400, "max_tokens");
  expect_error(with("n", 100000), 400, "n");
  expect_error(with("max_tokens", 1e30), 400, "max_tokens");
  expect_error(with("stop", json(std::vector<std::string>(1000, "x"))), 400, "stop");
  expect_error(with("messages", json::array()), 400, "messages");
  expect_error(with("messages", "hello"), 400, "messages");
  expect_error(with("stream_options", {{"include_usage", true}}), 400, "stream_options");
  expect_error(with("temperature", "hot"), 400, "temperature", "must be a number");
  // 18 prompt tokens + 239 > 256: the message gives the numbers.
  expect_error(with("max_tokens", 239), 400, "max_tokens",
               "maximum context length is 256 tokens. However, you requested 257 tokens (18 in the messages, 239 in the completion)");
  EXPECT_EQ(with("max_tokens", 238)->status, 200);
}

TEST_F(HttpServerTest, MalformedBodiesAre4xxAndTheServerStaysUp) {
  start();
  expect_error(client_->Post("/v1/chat/completions", "{not json", "application/json"), 400, "", "not valid JSON");
  expect_error(client_->Post("/v1/chat/completions", "[1, 2]", "application/json"), 400, "", "JSON object");
  expect_error(client_->Post("/v1/chat/completions", "\"text\"", "application/json"), 400);
  expect_error(client_->Post("/v1/chat/completions", chat(2).dump(), "text/plain"), 415, "", "application/json");
  std::string huge(100 * 1024, ' ');
  expect_error(client_->Post("/v1/chat/completions", huge, "application/json"), 413, "", "exceeds the limit");
  expect_error(client_->Get("/v1/nothing"), 404);
  expect_error(post("/v1/chat/completions", {{"model", "other"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}), 404,
               "model", "does not exist");
  EXPECT_EQ(post("/v1/chat/completions", chat(2))->status, 200);
}

TEST_F(HttpServerTest, ApiKeyIsRequiredExceptForHealth) {
  ServerOptions options;
  options.api_key = "s3cret";
  start(options);
  expect_error(post("/v1/chat/completions", chat(2)), 401, "", "API key");
  expect_error(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer wrong"}}), 401);
  expect_error(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer s3cre"}}), 401);
  expect_error(client_->Get("/v1/models"), 401);
  EXPECT_EQ(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer s3cret"}})->status, 200);
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(HttpServerTest, LoadingIs503AndQueueFullIs429) {
  start();
  backend_.is_ready = false;
  expect_error(post("/v1/chat/completions", chat(2)), 503, "", "loading");
  EXPECT_EQ(client_->Get("/health")->status, 503);
  backend_.is_ready = true;
  backend_.max_live = 0;
  expect_error(post("/v1/chat/completions", chat(2)), 429, "", "queue is full");
}

// A failed rank turns /health 503 at once, naming the rank and its error,
// and new generation requests get a 503 saying the same; recovery turns
// both back.
TEST_F(HttpServerTest, ExecutorDownIs503OnHealthAndRequestsNamingTheRank) {
  start();
  ASSERT_EQ(client_->Get("/health")->status, 200);
  backend_.set_down("replica 0: restarting its executor after: rank 1 (tp 1, pp 0) failed: boom");
  json h = expect_error(client_->Get("/health"), 503, "", "rank 1 (tp 1, pp 0) failed: boom");
  EXPECT_EQ(h["error"]["code"], "executor_down");
  expect_error(post("/v1/chat/completions", chat(2)), 503, "", "rank 1 (tp 1, pp 0) failed: boom");
  backend_.set_down("");
  EXPECT_EQ(client_->Get("/health")->status, 200);
  EXPECT_EQ(post("/v1/chat/completions", chat(2))->status, 200);
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamCancelsTheRequest) {
  backend_.pace = std::chrono::milliseconds(20);
  start();
  json req = chat(200);
  req["stream"] = true;
  int chunks = 0;
  httplib::Client c("127.0.0.1", server_->port());
  httplib::Request hr;
  hr.method = "POST";
  hr.path = "/v1/chat/completions";
  hr.body = req.dump();
  hr.set_header("Content-Type", "application/json");
  hr.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // hang up early
  c.send(hr);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((backend_.live > 0 || server_->active_requests() > 0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend_.cancelled, 1);
  EXPECT_EQ(backend_.live, 0);
  EXPECT_EQ(server_->active_requests(), 0u);
}

TEST_F(HttpServerTest, ManyImpatientClientsLeaveItHealthy) {
  backend_.pace = std::chrono::milliseconds(10);
  ServerOptions options;
  options.n_http_threads = 16;
  start(options);
  std::vector<std::thread> clients;
  for (int i = 0; i < 200; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", server_->port());
      c.set_read_timeout(0, 50 * 1000);  // 50 ms: gives up long before 100 tokens
      json req = chat(100);
      req["stream"] = (i % 2) == 0;
      c.Post("/v1/chat/completions", req.dump(), "application/json");
    });
  }
  for (auto& t : clients) t.join();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (backend_.live > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(backend_.live, 0);
  // Nothing is left holding a worker or a request: the next one is served
  // as on a fresh server (no wall-clock bound: it measures the machine).
  EXPECT_TRUE(shardlm::testing::wait_until([&] { return server_->active_requests() == 0u; }))
      << "impatient clients' requests are still tracked: " << server_->active_requests();
  auto r = post("/v1/chat/completions", chat(2));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpServerTest, GracefulStopAbortsInFlightRequests) {
  backend_.pace = std::chrono::milliseconds(20);
  start();
  std::thread client([&] {
    httplib::Client c("127.0.0.1", server_->port());
    json req = chat(200);
    req["stream"] = true;
    c.Post("/v1/chat/completions", req.dump(), "application/json");
  });
  ASSERT_TRUE(shardlm::testing::wait_until([&] { return server_->active_requests() == 1u && backend_.live == 1; }))
      << "waited 60 s for the streaming request to reach the backend";
  server_->stop(std::chrono::milliseconds(100));
  client.join();
  thread_.join();
  EXPECT_EQ(backend_.cancelled, 1);
  EXPECT_EQ(server_->active_requests(), 0u);
}

}  // namespace
}  // namespace shardlm::server

namespace shardlm::server {
namespace {

TEST(HttpServerBind, APortInUseIsRefusedNotShared) {
  testing::FakeBackend backend;
  ServerOptions o;
  o.port = 0;
  HttpServer first(backend, o);
  first.bind();
  o.port = first.port();
  HttpServer second(backend, o);
  try {
    second.bind();
    FAIL() << "bound a port that is in use";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(o.port)), std::string::npos);
  }
}

}  // namespace
}  // namespace shardlm::server

namespace shardlm::server {
namespace {

int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything the server sends until it closes the connection.
std::string read_to_close(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

class SlowClientTest : public HttpServerTest {};

// A client that connects and is slow to write (a starved process, a busy
// host) is answered, not closed: httplib alone waited 5 s for the first
// byte and then closed the connection with no status line.
TEST_F(SlowClientTest, ARequestThatArrivesLateIsStillAnswered) {
  start();
  const int fd = connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  // Late by more than httplib's 5 s keep-alive wait: a lower bound on the
  // delay, which a slower machine only lengthens.
  std::this_thread::sleep_for(std::chrono::milliseconds(5500));
  const std::string body = chat(2).dump();
  const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  const std::string answer = read_to_close(fd);
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer.substr(0, 300);
  EXPECT_NE(answer.find("chat.completion"), std::string::npos) << answer.substr(0, 300);
}

// A connection that never sends a request gets 408 with an OpenAI-shaped
// body once --request-start-timeout passes, and the server serves on.
TEST_F(SlowClientTest, ASilentConnectionGets408ThenTheServerServesOn) {
  ServerOptions options;
  options.request_start_timeout_s = 1;
  start(options);
  const int fd = connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  const std::string answer = read_to_close(fd);  // returns when the server gives up on us
  ::close(fd);
  ASSERT_EQ(answer.rfind("HTTP/1.1 408", 0), 0u) << answer;
  const size_t body_at = answer.find("\r\n\r\n");
  ASSERT_NE(body_at, std::string::npos);
  json body = json::parse(answer.substr(body_at + 4));
  EXPECT_EQ(body["error"]["code"], "request_timeout");
  EXPECT_NE(body["error"]["message"].get<std::string>().find("1000 ms"), std::string::npos) << answer;
  auto r = post("/v1/chat/completions", chat(2));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}


// What the gate refuses from the request head alone: the client sends only
// the head (no body), and gets its answer anyway, which shows the body was
// never awaited or read.
std::string send_head_and_read(int port, const std::string& head) {
  const int fd = connect_loopback(port);
  if (fd < 0) return "connect failed";
  ::send(fd, head.data(), head.size(), MSG_NOSIGNAL);
  std::string answer = read_to_close(fd);
  ::close(fd);
  return answer;
}

json answer_body(const std::string& answer) {
  const size_t at = answer.find("\r\n\r\n");
  return at == std::string::npos ? json() : json::parse(answer.substr(at + 4), nullptr, false);
}

TEST_F(SlowClientTest, AnOversizedHeadIs431AndIsNotBuffered) {
  start();
  std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(100 * 1024, 'a') + "\r\n\r\n";
  const std::string answer = send_head_and_read(server_->port(), head);
  ASSERT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
  EXPECT_EQ(answer_body(answer)["error"]["code"], "header_too_large");
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

TEST_F(SlowClientTest, ChunkedBodiesAre411AndOversizedLengthsAre413BeforeTheBody) {
  start();
  std::string answer = send_head_and_read(
      server_->port(), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n");
  ASSERT_EQ(answer.rfind("HTTP/1.1 411", 0), 0u) << answer.substr(0, 200);
  EXPECT_NE(answer_body(answer)["error"]["message"].get<std::string>().find("Content-Length"), std::string::npos);
  answer = send_head_and_read(server_->port(),
                              "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: 104857600\r\n\r\n");
  ASSERT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer.substr(0, 200);
  EXPECT_NE(answer_body(answer)["error"]["message"].get<std::string>().find("104857600"), std::string::npos) << answer;
  answer = send_head_and_read(server_->port(), "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n"
                                               "Content-Length: 7\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer.substr(0, 200);
  answer = send_head_and_read(server_->port(), "NOT A REQUEST\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer.substr(0, 200);
  EXPECT_EQ(post("/v1/chat/completions", chat(2))->status, 200);
}

// Authentication happens on the head: an unauthenticated client that
// announces a body is answered without sending it. The key is compared as
// sent, byte for byte: no URL-decoding of "%41" into "A".
TEST_F(SlowClientTest, TheApiKeyIsCheckedOnTheRawHeadBeforeTheBody) {
  ServerOptions options;
  options.api_key = "k%41y";
  start(options);
  const std::string answer =
      send_head_and_read(server_->port(), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                          "Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n");
  ASSERT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << answer.substr(0, 200);
  EXPECT_EQ(answer_body(answer)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer k%41y"}})->status, 200);
  EXPECT_EQ(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer kAy"}})->status, 401);
  EXPECT_EQ(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer k%2541y"}})->status, 401);
  EXPECT_EQ(client_->Get("/health")->status, 200);  // needs no key
}

// An early error on a kept-alive connection (a wrong key, a missing route,
// a wrong content type, all with a body) must not leave its body in the
// socket for the next request to be parsed from: a second request on the
// same connection is either answered correctly or the first answer says
// Connection: close and the connection ends there (agents retry on a new
// one). Before the gate, a 401 left the body unread and the next request
// got a 414.
TEST_F(SlowClientTest, AnEarlyErrorWithABodyDrainsOrClosesTheConnection) {
  ServerOptions options;
  options.api_key = "right";
  start(options);
  const std::string good_body = chat(2).dump();
  const std::string good = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer right\r\n"
                           "Connection: close\r\nContent-Type: application/json\r\nContent-Length: " +
                           std::to_string(good_body.size()) + "\r\n\r\n" + good_body;
  const std::string body(3000, 'x');  // long enough to look like a request line of its own
  struct Case {
    std::string head;
    int status;
    bool kept_alive;  // answered after the body was read: the next request is served on the same connection
  } cases[] = {
      {"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
       "Content-Type: application/json\r\n", 401, false},
      {"POST /v1/nowhere HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer right\r\nContent-Type: application/json\r\n", 404, true},
      {"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer right\r\nContent-Type: text/plain\r\n", 415, true},
  };
  for (const Case& c : cases) {
    const int fd = connect_loopback(server_->port());
    ASSERT_GE(fd, 0);
    const std::string both = c.head + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body + good;
    ASSERT_EQ(::send(fd, both.data(), both.size(), MSG_NOSIGNAL), static_cast<ssize_t>(both.size()));
    const std::string answer = read_to_close(fd);
    ::close(fd);
    ASSERT_EQ(answer.rfind("HTTP/1.1 " + std::to_string(c.status), 0), 0u) << answer.substr(0, 300);
    const size_t second = answer.find("HTTP/1.1 ", 1);
    if (c.kept_alive) EXPECT_NE(second, std::string::npos) << c.status << ": " << answer.substr(0, 600);
    if (second == std::string::npos) {
      std::string head = answer.substr(0, answer.find("\r\n\r\n"));
      std::transform(head.begin(), head.end(), head.begin(), [](unsigned char ch) { return std::tolower(ch); });
      EXPECT_NE(head.find("connection: close"), std::string::npos) << c.status << ": " << head;
    } else {
      EXPECT_EQ(answer.compare(second, 12, "HTTP/1.1 200"), 0) << c.status << ": " << answer.substr(second, 300);
    }
    EXPECT_EQ(answer.find(" 414 "), std::string::npos) << answer.substr(0, 600);
  }
  // And the server serves on.
  EXPECT_EQ(post("/v1/chat/completions", chat(2), {{"Authorization", "Bearer right"}})->status, 200);
}

// A request on the wire, with a body; `close` adds Connection: close.
std::string chat_request(const std::string& body, bool close) {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         std::string(close ? "Connection: close\r\n" : "") + "Content-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// The HTTP/1.1 responses in `bytes`, in order: (status, body). Content-Length
// bodies only (what non-streaming answers use).
std::vector<std::pair<int, std::string>> split_responses(const std::string& bytes) {
  std::vector<std::pair<int, std::string>> out;
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.compare(at, 9, "HTTP/1.1 ") != 0) break;
    const size_t end = bytes.find("\r\n\r\n", at);
    if (end == std::string::npos) break;
    std::string head = bytes.substr(at, end - at);
    std::transform(head.begin(), head.end(), head.begin(), [](unsigned char ch) { return std::tolower(ch); });
    const int status = std::stoi(bytes.substr(at + 9, 3));
    const size_t cl = head.find("content-length: ");
    const size_t n = cl == std::string::npos ? 0 : std::stoul(head.substr(cl + 16));
    if (end + 4 + (status >= 200 ? n : 0) > bytes.size()) break;  // not all here yet
    if (status >= 200) out.emplace_back(status, bytes.substr(end + 4, n));
    at = end + 4 + (status >= 200 ? n : 0);
  }
  return out;
}

// Pipelined requests (all sent before any answer is read) are answered in
// order on the one connection; httplib's own keep-alive loop read ahead and
// lost them, and with one request per connection only the first was
// answered.
TEST_F(SlowClientTest, PipelinedRequestsAreAllAnsweredInOrder) {
  backend_.script = "ok";
  start();
  const int fd = connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  std::string all;
  for (int i = 1; i <= 3; ++i) all += chat_request(chat(i).dump(), i == 3);
  ASSERT_EQ(::send(fd, all.data(), all.size(), MSG_NOSIGNAL), static_cast<ssize_t>(all.size()));
  const auto answers = split_responses(read_to_close(fd));
  ::close(fd);
  ASSERT_EQ(answers.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(answers[i].first, 200) << answers[i].second;
    // max_tokens 1, 2, 3 of "ok": the answers are the requests' own, in order.
    EXPECT_EQ(json::parse(answers[i].second)["choices"][0]["message"]["content"], std::string("ok").substr(0, i + 1));
  }
}

// A kept-alive connection carries request after request, each through the
// gate: a later request's oversized head is still refused.
TEST_F(SlowClientTest, KeptAliveConnectionsServeOnAndEachHeadIsJudged) {
  start();
  const int fd = connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    const std::string req = chat_request(chat(2).dump(), false);
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string got;
    char buf[4096];
    while (split_responses(got).empty()) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      ASSERT_GT(n, 0) << "the connection closed after " << i << " requests: " << got;
      got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_EQ(split_responses(got)[0].first, 200);
  }
  const std::string big = "GET /health HTTP/1.1\r\nHost: x\r\nX-Long: " + std::string(100 * 1024, 'a') + "\r\n\r\n";
  ::send(fd, big.data(), big.size(), MSG_NOSIGNAL);
  const std::string answer = read_to_close(fd);
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer.substr(0, 200);
}

// A client that sends its request and shuts its sending side (a half-close,
// as `nc -N` or a shell pipe does) still gets its answer, streamed or not;
// before, the hang-up poll took the half-close for a departure and
// cancelled the request. A client that really leaves is still noticed (the
// probe's reset): ManyImpatientClientsLeaveItHealthy and the disconnect tests.
TEST_F(SlowClientTest, AHalfClosedClientIsAnswered) {
  backend_.pace = std::chrono::milliseconds(150);  // the request is still running when the half-close arrives
  backend_.script = "abc";
  start();
  for (bool stream : {false, true}) {
    json req = chat(3);
    req["stream"] = stream;
    const int fd = connect_loopback(server_->port());
    ASSERT_GE(fd, 0);
    const std::string wire = chat_request(req.dump(), true);
    ASSERT_EQ(::send(fd, wire.data(), wire.size(), MSG_NOSIGNAL), static_cast<ssize_t>(wire.size()));
    ::shutdown(fd, SHUT_WR);
    const std::string answer = read_to_close(fd);
    ::close(fd);
    const size_t status_at = answer.find("HTTP/1.1 2");  // after any 100 Continue probe
    ASSERT_NE(status_at, std::string::npos) << "stream " << stream << ": " << answer.substr(0, 300);
    EXPECT_EQ(answer.compare(status_at, 12, "HTTP/1.1 200"), 0) << answer.substr(0, 300);
    if (stream) {
      EXPECT_NE(answer.find("[DONE]"), std::string::npos) << answer;
      for (char ch : std::string("abc")) EXPECT_NE(answer.find("\"content\":\"" + std::string(1, ch) + "\""), std::string::npos) << answer;
    } else {
      EXPECT_NE(answer.find("\"content\":\"abc\""), std::string::npos) << answer;
    }
  }
  EXPECT_EQ(backend_.cancelled, 0);
}

// Connections that never finish their head, or trickle their body, wait on
// the gate's poller and hold no HTTP thread: with two threads and twenty
// such connections, a normal request is served at once. Before, each held a
// thread for up to 30 s.
TEST_F(SlowClientTest, SlowHeadsAndBodiesHoldNoThread) {
  ServerOptions options;
  options.n_http_threads = 2;
  start(options);
  std::vector<int> slow;
  for (int i = 0; i < 20; ++i) {
    const int fd = connect_loopback(server_->port());
    ASSERT_GE(fd, 0);
    const std::string whole = chat_request(chat(2).dump(), true);
    const std::string part = i % 2 == 0 ? whole.substr(0, whole.find("\r\n") + 2)  // half a head
                                        : whole.substr(0, whole.size() - 10);          // head whole, body cut
    ::send(fd, part.data(), part.size(), MSG_NOSIGNAL);
    slow.push_back(fd);
  }
  EXPECT_TRUE(shardlm::testing::wait_until([&] { return server_->waiting_connections() >= 20u; }))
      << server_->waiting_connections();
  auto r = post("/v1/chat/completions", chat(2));
  ASSERT_TRUE(r) << "a normal request was not served while slow connections waited";
  EXPECT_EQ(r->status, 200);
  for (int fd : slow) ::close(fd);
}

// A chat request whose body is padded with whitespace to `n_bytes` and more.
std::string large_chat_request(size_t n_bytes, const std::string& extra_headers = "") {
  json body = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}};
  const std::string text = body.dump() + std::string(n_bytes, ' ');
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n" +
         extra_headers + "Content-Length: " + std::to_string(text.size()) + "\r\n\r\n" + text;
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    bytes.remove_prefix(size_t(n));
  }
  return true;
}

// Bodies too large to wait for in the kernel's buffer (200 KB, past the
// 64 KiB that SO_RCVLOWAT waits for) are read into memory by the head waiter:
// four clients that stop ten bytes short hold no thread of two, a normal
// request is served beside them, and each is answered once its body ends.
TEST_F(SlowClientTest, LargeTrickledBodiesHoldNoThread) {
  ServerOptions options;
  options.n_http_threads = 2;
  start(options, 1 << 20);
  const std::string whole = large_chat_request(200'000);
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    const int fd = connect_loopback(server_->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, std::string_view(whole).substr(0, whole.size() - 10)));
    slow.push_back(fd);
  }
  EXPECT_TRUE(shardlm::testing::wait_until([&] { return server_->buffered_body_bytes() == 4 * (whole.size() - 10); }))
      << server_->buffered_body_bytes();
  auto r = post("/v1/chat/completions", chat(2));
  ASSERT_TRUE(r) << "a normal request was not served while large bodies trickled in";
  EXPECT_EQ(r->status, 200);
  for (int fd : slow) {
    ASSERT_TRUE(send_all(fd, std::string_view(whole).substr(whole.size() - 10)));
    const std::string answer = read_to_close(fd);
    ::close(fd);
    EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer.substr(0, 300);
  }
  EXPECT_EQ(server_->buffered_body_bytes(), 0u);
}

// Past max_buffered_body_bytes a connection's body is left in the socket
// until the bytes of another are handed on; then it is read and served.
TEST_F(SlowClientTest, BodiesPastTheBufferBudgetWaitTheirTurn) {
  ServerOptions options;
  options.n_http_threads = 2;
  options.max_buffered_body_bytes = 300'000;  // one 200 KB body at a time
  start(options, 1 << 20);
  const std::string whole = large_chat_request(200'000);
  const size_t first_part = whole.size() - 10;
  int fds[2];
  for (int& fd : fds) {
    fd = connect_loopback(server_->port());
    ASSERT_GE(fd, 0);
  }
  ASSERT_TRUE(send_all(fds[0], std::string_view(whole).substr(0, first_part)));
  ASSERT_TRUE(shardlm::testing::wait_until([&] { return server_->buffered_body_bytes() == first_part; }));
  // The second sends all of itself and half-closes (as `nc -N` does); it is
  // parked: its bytes stay in the kernel (so its sender blocks on TCP's
  // window, on a thread of its own), and it still gets its answer.
  std::thread second([&] {
    send_all(fds[1], whole);
    ::shutdown(fds[1], SHUT_WR);
  });
  // (EXPECT, not ASSERT: the sender must be joined.)
  EXPECT_TRUE(shardlm::testing::wait_until([&] { return server_->waiting_connections() == 2u; }));
  EXPECT_EQ(server_->buffered_body_bytes(), first_part);
  EXPECT_TRUE(send_all(fds[0], std::string_view(whole).substr(first_part)));
  std::string answer = read_to_close(fds[0]);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer.substr(0, 300);
  second.join();
  answer = read_to_close(fds[1]);
  // After the half-close probe (a 100 Continue), the answer.
  EXPECT_NE(answer.find("\r\n\r\nHTTP/1.1 200"), std::string::npos) << answer.substr(0, 300);
  EXPECT_NE(answer.find("chat.completion"), std::string::npos) << answer.substr(0, 300);
  for (int fd : fds) ::close(fd);
}

// Expect: 100-continue: the head waiter sends the 100 Continue and reads the
// body itself; the client sees one 100 Continue, then the answer.
TEST_F(SlowClientTest, AnExpectContinueBodyIsReadByTheWaiter) {
  ServerOptions options;
  options.n_http_threads = 2;
  start(options, 1 << 20);
  const std::string whole = large_chat_request(100'000, "Expect: 100-continue\r\n");
  const size_t head_end = whole.find("\r\n\r\n") + 4;
  const int fd = connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, std::string_view(whole).substr(0, head_end)));
  const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
  std::string got(kContinue.size(), '\0');
  ASSERT_EQ(::recv(fd, got.data(), got.size(), MSG_WAITALL), static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, kContinue);
  ASSERT_TRUE(send_all(fd, std::string_view(whole).substr(head_end)));
  const std::string answer = read_to_close(fd);
  ::close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer.substr(0, 300);
  EXPECT_NE(answer.find("chat.completion"), std::string::npos) << answer.substr(0, 300);
}

}  // namespace
}  // namespace shardlm::server

namespace shardlm::server {
namespace {

// Burst admission against hostile input: a POST the server refuses, or one
// whose client leaves before its body is in, leaves no announcement behind.
// One left behind would make an idle engine hold every later request for
// its whole burst window (serve --burst-window-ms).
TEST_F(HttpServerTest, RefusedAndAbandonedPostsLeaveNoAnnouncementBehind) {
  auto board = std::make_shared<Arrivals>();
  backend_.arrivals_board = board;
  std::mutex mu;
  std::condition_variable changed;
  const int listener = board->add_listener([&] {
    std::lock_guard<std::mutex> lock(mu);
    changed.notify_all();
  });
  // A withdrawal follows the response by a moment (the worker releases its
  // ticket once the response is written): wait for it, with a guard only.
  const auto none_pending = [&] {
    std::unique_lock<std::mutex> lock(mu);
    return changed.wait_for(lock, std::chrono::seconds(30), [&] { return board->n_pending() == 0; });
  };
  start();
  expect_error(client_->Post("/v1/chat/completions", "{\"model\": ", "application/json"), 400);
  EXPECT_TRUE(none_pending()) << "a request with a broken JSON body kept its announcement";
  json unknown = chat(2);
  unknown["frobnicate"] = true;
  expect_error(post("/v1/chat/completions", unknown), 400, "frobnicate");
  EXPECT_TRUE(none_pending()) << "a refused parameter kept its announcement";
  json huge = chat(2);
  huge["messages"][0]["content"] = std::string(128 * 1024, 'x');  // over the 64 KiB body limit
  expect_error(post("/v1/chat/completions", huge), 413);
  EXPECT_TRUE(none_pending()) << "an oversized body kept its announcement";
  const int64_t announced = board->n_announced();
  // Half a body, then the client goes: never whole, so never announced.
  const int fd = connect_loopback(server_->port());
  ASSERT_GE(fd, 0);
  const std::string cut = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: 100\r\n\r\n{\"model\": \"ti";
  ASSERT_EQ(::send(fd, cut.data(), cut.size(), MSG_NOSIGNAL), static_cast<ssize_t>(cut.size()));
  ::close(fd);
  // The next request is alone at its submission: nothing else is announced.
  auto r = post("/v1/chat/completions", chat(2));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  {
    std::lock_guard<std::mutex> lock(backend_.seen_mutex);
    EXPECT_EQ(backend_.pending_at_submit, (std::vector<int64_t>{1}));
  }
  EXPECT_TRUE(none_pending());
  EXPECT_EQ(board->n_announced(), announced + 1);
  board->remove_listener(listener);
}

}  // namespace
}  // namespace shardlm::server
