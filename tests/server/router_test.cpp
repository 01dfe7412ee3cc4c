#include "server/router.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fake_backend.h"
#include "server/http_server.h"

namespace shardlm::server {
namespace {

using json = nlohmann::json;

TEST(RoutingPolicy, LeastOutstandingWorkWins) {
  RoutingPolicy p(3);
  EXPECT_EQ(p.acquire("", 100), 0);
  EXPECT_EQ(p.acquire("", 50), 1);
  EXPECT_EQ(p.acquire("", 10), 2);
  EXPECT_EQ(p.acquire("", 10), 2);  // 20 < 50 < 100
  p.release(0, 100);
  EXPECT_EQ(p.acquire("", 1), 0);
  p.set_healthy(0, false);
  EXPECT_NE(p.acquire("", 1), 0);
  EXPECT_EQ(p.acquire("", 1, {1, 2}), -1);  // 0 unhealthy, 1 and 2 excluded
}

TEST(RoutingPolicy, SharedPrefixesStickUnlessTheReplicaIsOverloaded) {
  RoutingOptions options;
  options.affinity_slack_tokens = 1000;
  RoutingPolicy p(4, options);
  const std::string prefix(600, 'x');
  int first = p.acquire(prefix + "question one", 10);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(p.acquire(prefix + "question " + std::to_string(i), 10), first);
  // Pile work on the pinned replica: past the slack the least loaded wins.
  p.acquire(prefix, 5000);  // lands on `first` too (affinity)
  EXPECT_NE(p.acquire(prefix + "next", 10), first);
}

TEST(Router, ParsesBackendUrls) {
  auto a = parse_backend_url("http://10.0.0.2:8001");
  EXPECT_EQ(a.host, "10.0.0.2");
  EXPECT_EQ(a.port, 8001);
  EXPECT_EQ(parse_backend_url("http://[::1]:9000/").host, "::1");
  EXPECT_THROW(parse_backend_url("https://x:1"), Error);
  EXPECT_THROW(parse_backend_url("10.0.0.2:8000"), Error);
}

// Two fake replicas behind a router.
class RouterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      backends_[i].pace = std::chrono::milliseconds(2);
      ServerOptions o;
      o.port = 0;
      o.served_model_names = {"tiny"};
      servers_[i] = std::make_unique<HttpServer>(backends_[i], o);
      servers_[i]->bind();
      threads_[i] = std::thread([this, i] { servers_[i]->run(); });
    }
    RouterOptions ro;
    ro.port = 0;
    ro.health_interval_ms = 100;
    for (int i = 0; i < 2; ++i) ro.backends.push_back("http://127.0.0.1:" + std::to_string(servers_[i]->port()));
    router_ = std::make_unique<Router>(ro);
    router_->bind();
    router_thread_ = std::thread([this] { router_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", router_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    router_->stop();
    router_thread_.join();
    for (int i = 0; i < 2; ++i) {
      if (servers_[i]) servers_[i]->stop(std::chrono::milliseconds(0));
      if (threads_[i].joinable()) threads_[i].join();
    }
  }
  httplib::Result chat(const std::string& content, bool stream = false) {
    json req = {{"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 3}, {"stream", stream}};
    return client_->Post("/v1/chat/completions", req.dump(), "application/json");
  }

  testing::FakeBackend backends_[2];
  std::unique_ptr<HttpServer> servers_[2];
  std::thread threads_[2];
  std::unique_ptr<Router> router_;
  std::thread router_thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(RouterTest, SpreadsConcurrentLoadAndRelaysStreams) {
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", router_->port());
      json req = {{"messages", {{{"role", "user"}, {"content", "q" + std::to_string(i)}}}}, {"max_tokens", 20}};
      auto t0 = std::chrono::steady_clock::now();
      auto r = c.Post("/v1/chat/completions", req.dump(), "application/json");
      if (r && r->status == 200) ++ok;
      else ADD_FAILURE() << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() << " ms " << (r ? std::to_string(r->status) + " " + r->body : httplib::to_string(r.error()));
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok, 16);
  EXPECT_GT(router_->requests_to(0), 0);
  EXPECT_GT(router_->requests_to(1), 0);
  auto s = chat("hello", true);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->status, 200);
  EXPECT_NE(s->body.find("chat.completion.chunk"), std::string::npos);
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos);
  // Backend errors pass through with their status.
  auto bad = client_->Post("/v1/chat/completions", R"({"messages": [], "max_tokens": 3})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(json::parse(bad->body)["error"]["param"], "messages");
}

TEST_F(RouterTest, ADeadBackendLosesNoRequest) {
  servers_[0]->stop(std::chrono::milliseconds(0));
  threads_[0].join();
  servers_[0].reset();
  int ok = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = chat(std::string(100, 'p') + std::to_string(i));  // long prompts: affinity may pick the dead one
    if (r && r->status == 200) ++ok;
  }
  EXPECT_EQ(ok, 10);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (router_->backend_healthy(0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(router_->backend_healthy(0));
  EXPECT_TRUE(router_->backend_healthy(1));
  EXPECT_EQ(client_->Get("/health")->status, 200);
}

}  // namespace
}  // namespace shardlm::server
