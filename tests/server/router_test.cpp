#include "server/router.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
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
  // What the fake replicas generate, set before they serve (a replica's
  // thread reads them for every request).
  std::chrono::milliseconds replica_pace_{2};
  std::string replica_script_;
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      backends_[i].pace = replica_pace_;
      backends_[i].script = replica_script_;
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

// Issue 26: the agent APIs pass through; a stored response is found on
// whichever replica answered it.
TEST_F(RouterTest, ForwardsTheAgentApis) {
  json messages = {{"model", "tiny"}, {"max_tokens", 3}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto m = client_->Post("/v1/messages?beta=true", {{"anthropic-version", "2023-06-01"}}, messages.dump(), "application/json");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->status, 200) << m->body;
  EXPECT_EQ(json::parse(m->body)["type"], "message");
  messages.erase("max_tokens");
  auto count = client_->Post("/v1/messages/count_tokens", messages.dump(), "application/json");
  ASSERT_EQ(count->status, 200) << count->body;
  EXPECT_EQ(json::parse(count->body)["input_tokens"], 18);
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    auto r = client_->Post("/v1/responses", json{{"input", "q" + std::to_string(i)}, {"max_output_tokens", 2}}.dump(),
                           "application/json");
    ASSERT_EQ(r->status, 200) << r->body;
    ids.push_back(json::parse(r->body)["id"]);
  }
  for (const auto& id : ids) {
    auto got = client_->Get(("/v1/responses/" + id).c_str());
    ASSERT_EQ(got->status, 200) << got->body;
    EXPECT_EQ(json::parse(got->body)["id"], id);
  }
  EXPECT_EQ(client_->Delete(("/v1/responses/" + ids[0]).c_str())->status, 200);
  EXPECT_EQ(client_->Get(("/v1/responses/" + ids[0]).c_str())->status, 404);
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

// A backend whose executor is down answers 503 before any byte reached the
// client: the router retries the request elsewhere and stops routing there.
TEST_F(RouterTest, ABackendWhoseExecutorIsDownIsRoutedAroundAndItsRequestsRetried) {
  backends_[0].set_down("replica 0: restarting its executor after: rank 1 (tp 1, pp 0) failed: boom");
  int ok = 0;
  for (int i = 0; i < 10; ++i) {
    auto r = chat(std::string(100, 'q') + std::to_string(i));
    if (r && r->status == 200) ++ok;
    else ADD_FAILURE() << (r ? r->body : "no response");
  }
  EXPECT_EQ(ok, 10);
  EXPECT_FALSE(router_->backend_healthy(0));
  EXPECT_EQ(backends_[0].live, 0);
  backends_[0].set_down("");  // recovered: the health loop brings it back
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!router_->backend_healthy(0) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(router_->backend_healthy(0));
}

int send_and_hold(int port, const std::string& body) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const std::string req = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  if (send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) return -1;
  return fd;
}

// A non-streaming client that hangs up: the router closes the upstream
// connection, so the backend cancels the request (frees its KV) at once.
TEST_F(RouterTest, ANonStreamingClientsHangUpReachesTheBackend) {
  for (auto& b : backends_) b.pace = std::chrono::milliseconds(20);  // 200 tokens: 4 s
  json req = {{"messages", {{{"role", "user"}, {"content", "long"}}}}, {"max_tokens", 200}};
  const int fd = send_and_hold(router_->port(), req.dump());
  ASSERT_GE(fd, 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (backends_[0].live + backends_[1].live == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(backends_[0].live + backends_[1].live, 1);
  close(fd);
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (backends_[0].cancelled + backends_[1].cancelled == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(backends_[0].cancelled + backends_[1].cancelled, 1);
}

// A client that half-closes (shuts its sending side) in the middle of a
// relayed stream still waits for the rest: the router probes it with an SSE
// comment between events, as serve does, rather than cut the stream.
// Replicas whose events are 100 ms apart, so that a half-close lands between two.
class RouterSlowStreamTest : public RouterTest {
 protected:
  RouterSlowStreamTest() {
    replica_pace_ = std::chrono::milliseconds(100);
    replica_script_ = "abc";
  }
};

TEST_F(RouterSlowStreamTest, AHalfClosedStreamingClientGetsTheWholeStream) {
  json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 3}, {"stream", true}};
  const int fd = send_and_hold(router_->port(), req.dump());
  ASSERT_GE(fd, 0);
  std::string answer;
  char buf[4096];
  while (answer.find("\"content\":\"a\"") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << answer;
    answer.append(buf, size_t(n));
  }
  shutdown(fd, SHUT_WR);
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) answer.append(buf, size_t(n));
  close(fd);
  EXPECT_NE(answer.find("\"content\":\"c\""), std::string::npos) << answer;
  EXPECT_NE(answer.find("[DONE]"), std::string::npos) << answer;
  EXPECT_EQ(backends_[0].cancelled + backends_[1].cancelled, 0);
}

// stop() cuts the upstream readers instead of leaving them running: it
// returns promptly with a long request in flight, and the backend cancels it.
TEST_F(RouterTest, StopLeavesNoUpstreamReaderBehind) {
  for (auto& b : backends_) b.pace = std::chrono::milliseconds(20);
  std::thread client([this] {
    httplib::Client c("127.0.0.1", router_->port());
    c.set_read_timeout(30, 0);
    json req = {{"messages", {{{"role", "user"}, {"content", "long"}}}}, {"max_tokens", 200}};
    c.Post("/v1/chat/completions", req.dump(), "application/json");
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (backends_[0].live + backends_[1].live == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(backends_[0].live + backends_[1].live, 1);
  const auto t0 = std::chrono::steady_clock::now();
  router_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  client.join();
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (backends_[0].cancelled + backends_[1].cancelled == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(backends_[0].cancelled + backends_[1].cancelled, 1);
}

}  // namespace
}  // namespace shardlm::server
