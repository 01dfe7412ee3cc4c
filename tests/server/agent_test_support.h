// What the agent-API tests (anthropic_messages_test, responses_api_test)
// share: a server on the scripted FakeBackend that also records the grammars
// it was asked to compile (a forced tool call is a kToolCalls grammar), and
// an SSE reader that keeps each frame's event name.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <sstream>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "grammar/grammar_compiler.h"
#include "server/http_server.h"

namespace shardlm::server::testing {

using json = nlohmann::json;

// Compiles nothing (the fake generates its script whatever the grammar):
// records the spec so that a test sees what the request asked to enforce.
class GrammarRecordingBackend : public FakeBackend {
 public:
  mutable std::vector<grammar::GrammarSpec> specs;
  std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const grammar::GrammarSpec& spec) const override {
    std::lock_guard<std::mutex> lock(seen_mutex);
    specs.push_back(spec);
    return nullptr;
  }
};

struct SseFrame {
  std::string event;  // "" when the frame had no event line
  json data;
};

// "event: e\ndata: {...}\n\n" frames, in order.
inline std::vector<SseFrame> parse_sse(const std::string& body) {
  std::vector<SseFrame> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::istringstream frame(body.substr(pos, end - pos));
    SseFrame f;
    std::string line;
    while (std::getline(frame, line)) {
      if (line.rfind("event: ", 0) == 0) f.event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) f.data = json::parse(line.substr(6));
    }
    if (!f.data.is_null() || !f.event.empty()) out.push_back(std::move(f));
    pos = end + 2;
  }
  return out;
}

class AgentServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.port = 0;
    if (options.served_model_names.empty()) options.served_model_names = {"tiny"};
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
  json ok(const std::string& path, const json& body, httplib::Headers headers = {}) {
    auto r = post(path, body, headers);
    EXPECT_TRUE(r) << "no response";
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  std::vector<SseFrame> stream(const std::string& path, json body) {
    body["stream"] = true;
    auto r = post(path, body);
    EXPECT_TRUE(r) << "no response";
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
    return parse_sse(r->body);
  }

  GrammarRecordingBackend backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

constexpr const char* kHermesTemplate = "{% for t in tools %}{{ t | tojson }}{% endfor %}<tool_call>";
inline const std::string kCallScript =
    "Checking.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

}  // namespace shardlm::server::testing
