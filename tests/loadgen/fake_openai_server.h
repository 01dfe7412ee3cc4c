// A scripted OpenAI-compatible server for the load-generator tests: each
// streaming request gets its first token after first_token_ms, then one
// token every token_interval_ms, n_tokens in all, then a usage chunk and
// [DONE]. Times are scheduled from when the request arrives (sleep_until,
// so jitter does not accumulate). Listens on 127.0.0.1, ephemeral port.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/process.h"

namespace shardlm::loadgen::testing {

struct FakeServerOptions {
  int first_token_ms = 200;
  int token_interval_ms = 20;
  int n_tokens = 10;
  int prompt_tokens = 42;
  bool send_usage = true;
  int fail_every = 0;          // > 0: every fail_every-th request (1-based) answers HTTP 500
  bool split_events = true;    // write each SSE event in two pieces (exercises buffering)
  std::string model = "fake-model";
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(FakeServerOptions options = {}) : options_(std::move(options)) {
    server_.set_tcp_nodelay(true);
    server_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    server_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json j = {{"object", "list"},
                          {"data", {{{"id", options_.model}, {"object", "model"}, {"root", options_.model}}}}};
      res.set_content(j.dump(), "application/json");
    });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, true); });
    server_.Post("/v1/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { handle(req, res, false); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("fake server: cannot bind 127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib 0.11 has no "ready" event: poll is_running() (stop() before the
    // accept loop starts would be lost, and the destructor's join would hang).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!server_.is_running()) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("fake server: the accept loop did not start within 60 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int n_requests() const { return n_requests_.load(); }

  // Blocks until n requests have arrived, or `limit` passes (a deadline for
  // a broken test, not a timing: returns false, and the caller says what it
  // was waiting for).
  bool wait_for_requests(int n, std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu_);
    return arrived_.wait_for(lock, limit, [&] { return n_requests_.load() >= n; });
  }

  // When the server really received each request and began writing each of its
  // token events, on the steady clock: what a client measured can be
  // compared with what the server did, however late a loaded machine made
  // the server's sleeps.
  struct Timeline {
    nlohmann::json body;
    std::chrono::steady_clock::time_point arrived;
    std::vector<std::chrono::steady_clock::time_point> token_sent;  // [n_tokens], just before each write
  };
  std::vector<Timeline> timelines() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Timeline> out;
    for (const auto& t : timelines_) out.push_back(*t);
    return out;
  }

  std::vector<nlohmann::json> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }
  std::vector<std::string> paths() {
    std::lock_guard<std::mutex> lock(mu_);
    return paths_;
  }
  std::vector<std::string> auth_headers() {
    std::lock_guard<std::mutex> lock(mu_);
    return auth_;
  }

 private:
  void handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto t0 = std::chrono::steady_clock::now();
    auto timeline = std::make_shared<Timeline>();
    timeline->arrived = t0;
    int index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(nlohmann::json::parse(req.body, nullptr, false));
      timeline->body = bodies_.back();
      paths_.push_back(req.path);
      auth_.push_back(req.get_header_value("Authorization"));
      timelines_.push_back(timeline);
      index = ++n_requests_;
    }
    arrived_.notify_all();
    if (options_.fail_every > 0 && index % options_.fail_every == 0) {
      res.status = 500;
      res.set_content(R"({"error": {"message": "scripted failure", "type": "server_error"}})",
                      "application/json");
      return;
    }
    FakeServerOptions o = options_;
    res.set_chunked_content_provider("text/event-stream", [this, o, t0, chat, timeline](size_t,
                                                                                        httplib::DataSink& sink) {
      auto emit = [&](const std::string& event) {
        if (!o.split_events) return sink.write(event.data(), event.size());
        size_t half = event.size() / 2;
        return sink.write(event.data(), half) && sink.write(event.data() + half, event.size() - half);
      };
      for (int i = 0; i < o.n_tokens; ++i) {
        std::this_thread::sleep_until(t0 + std::chrono::milliseconds(o.first_token_ms + i * o.token_interval_ms));
        nlohmann::json chunk;
        chunk["object"] = chat ? "chat.completion.chunk" : "text_completion";
        chunk["model"] = o.model;
        std::string piece = " tok" + std::to_string(i);
        if (chat)
          chunk["choices"] = {{{"index", 0}, {"delta", {{"content", piece}}}, {"finish_reason", nullptr}}};
        else
          chunk["choices"] = {{{"index", 0}, {"text", piece}, {"finish_reason", nullptr}}};
        chunk["usage"] = nullptr;
        {
          std::lock_guard<std::mutex> lock(mu_);
          timeline->token_sent.push_back(std::chrono::steady_clock::now());
        }
        if (!emit("data: " + chunk.dump() + "\n\n")) return false;
      }
      if (o.send_usage) {
        nlohmann::json usage = {{"choices", nlohmann::json::array()},
                                {"usage",
                                 {{"prompt_tokens", o.prompt_tokens},
                                  {"completion_tokens", o.n_tokens},
                                  {"total_tokens", o.prompt_tokens + o.n_tokens}}}};
        if (!emit("data: " + usage.dump() + "\n\n")) return false;
      }
      if (!emit(": keep-alive comment\n\ndata: [DONE]\n\n")) return false;
      sink.done();
      return true;
    });
  }

  FakeServerOptions options_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> n_requests_{0};
  std::mutex mu_;
  std::condition_variable arrived_;
  std::vector<std::shared_ptr<Timeline>> timelines_;
  std::vector<nlohmann::json> bodies_;
  std::vector<std::string> paths_;
  std::vector<std::string> auth_;
};

// A loopback port with nothing listening (bound, then closed).
inline int dead_port() { return shardlm::testing::free_loopback_port(); }

}  // namespace shardlm::loadgen::testing
