// `shardlm serve` when a rank fails at run time (the test hook
// --debug-fail-rank-at-batch makes a chosen rank throw at batch N): the
// request in flight gets a 5xx naming the rank and its error, the executor
// restarts in process (ranks are threads) and serves again; with no restart
// left the process exits non-zero with the reason, never half-alive.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/process.h"

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using shardlm::testing::env_or;

struct Serve {
  pid_t pid = -1;
  int exit_code = -1;
  int port = 0;
  std::string log_path;
  ~Serve() { stop(); }
  int stop() {
    if (pid <= 0) return exit_code;
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Waits up to `timeout` for the process to exit by itself.
  bool wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::string log() const {
    std::ifstream in(log_path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

class ServeFaults : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cli_ = env_or("SHARDLM_CLI", "shardlm");
    dir_ = env_or("SHARDLM_BINARY_DIR", "/tmp") + "/tests/server/faults_model." + std::to_string(getpid());
    std::string cmd = cli_ + " make-model --like qwen2.5-7b --layers 2 --vocab 512 --hidden 128 --heads 4 --kv-heads 2 " +
                      "--intermediate 256 --seed 3 --out " + dir_ + " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Serve> start(const std::vector<std::string>& flags) {
    auto p = std::make_unique<Serve>();
    p->port = shardlm::testing::free_loopback_port();
    p->log_path = dir_ + "/serve." + std::to_string(p->port) + ".log";
    std::vector<std::string> args = {cli_, "serve", dir_, "--port", std::to_string(p->port), "--kv-cache-memory", "16MiB",
                                     "--served-model-name", "m"};
    args.insert(args.end(), flags.begin(), flags.end());
    p->pid = shardlm::testing::spawn_logged(args, p->log_path);
    httplib::Client c("127.0.0.1", p->port);
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return p;
      if (p->wait_exit(std::chrono::milliseconds(0))) {
        ADD_FAILURE() << "serve exited during start-up:\n" << p->log();
        return p;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "serve did not become healthy:\n" << p->log();
    return p;
  }

  static httplib::Result complete(int port, int max_tokens) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    json req = {{"model", "m"}, {"prompt", json{5, 17, 230, 41, 9}}, {"max_tokens", max_tokens}, {"temperature", 0},
                {"ignore_eos", true}};
    return c.Post("/v1/completions", req.dump(), "application/json");
  }

  static std::string cli_, dir_;
};
std::string ServeFaults::cli_, ServeFaults::dir_;

// A gauge's value in Prometheus text ("name{labels} value").
double gauge(const std::string& text, const std::string& name) {
  size_t at = text.find("\n" + name + "{");
  if (at == std::string::npos) return -1;
  size_t end = text.find('\n', at + 1);
  std::string line = text.substr(at + 1, end - at - 1);
  return std::stod(line.substr(line.rfind(' ') + 1));
}

TEST_F(ServeFaults, ARankFailureIsNamedThenTheExecutorRestartsAndServes) {
  auto s = start({"-tp", "2", "--debug-fail-rank-at-batch", "1:3"});
  ASSERT_GT(s->pid, 0);
  // /health is polled every 2 ms while the failing request runs: the first
  // 503 and the first 200 after it are the figures the issue asks for.
  std::atomic<bool> polling{true};
  std::atomic<int64_t> first_503_us{-1}, back_200_us{-1};
  const auto t_send = Clock::now();
  auto us_since = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
  };
  std::thread poller([&] {
    httplib::Client hc("127.0.0.1", s->port);
    hc.set_read_timeout(2, 0);
    while (polling && us_since(t_send) < 20'000'000) {
      auto h = hc.Get("/health");
      if (h && h->status == 503 && first_503_us < 0) first_503_us = us_since(t_send);
      if (h && h->status == 200 && first_503_us >= 0) {
        back_200_us = us_since(t_send);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  auto r = complete(s->port, 12);
  const int64_t answered_us = us_since(t_send);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  const std::string message = json::parse(r->body)["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("rank 1 (tp 1, pp 0) failed"), std::string::npos) << message;
  EXPECT_NE(message.find("injected failure at batch 3"), std::string::npos) << message;
  // Healthy again once the ranks reloaded (in-process restart).
  httplib::Client c("127.0.0.1", s->port);
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(20)) {
    auto h = c.Get("/health");
    if (h && h->status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  polling = false;
  poller.join();
  // /metrics counts the failure and the restart, and says why it failed.
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(gauge(m->body, "shardlm:executor_failures_total"), 1) << m->body;
  EXPECT_EQ(gauge(m->body, "shardlm:executor_restarts_total"), 1) << m->body;
  EXPECT_EQ(gauge(m->body, "shardlm:executor_up"), 1) << m->body;
  const double recovery_s = gauge(m->body, "shardlm:executor_last_recovery_seconds");
  EXPECT_GT(recovery_s, 0) << m->body;
  EXPECT_NE(m->body.find("shardlm:executor_last_failure_info{model_name=\"m\",reason=\"rank 1 (tp 1, pp 0) failed"),
            std::string::npos) << m->body;
  // The figures (from the send of the failing request): a 503 is only seen
  // when the restart outlasts a 2 ms poll.
  std::printf("recovery: 500 answered at %.1f ms; /health first 503 at %s, 200 again at %s; "
              "executor_last_recovery_seconds %.4f\n",
              answered_us / 1e3, first_503_us < 0 ? "(not seen)" : std::to_string(first_503_us / 1e3).c_str(),
              back_200_us < 0 ? "(n/a)" : std::to_string(back_200_us / 1e3).c_str(), recovery_s);
  auto ok = complete(s->port, 12);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 12);
  const std::string log = s->log();
  EXPECT_NE(log.find("the model executor restarted in"), std::string::npos) << log;
  EXPECT_EQ(s->stop(), 0) << s->log();
}

TEST_F(ServeFaults, WithNoRestartLeftServeExitsNonZeroWithTheReason) {
  auto s = start({"-tp", "2", "--max-executor-restarts", "0", "--debug-fail-rank-at-batch", "0:1"});
  ASSERT_GT(s->pid, 0);
  auto r = complete(s->port, 8);
  ASSERT_TRUE(r);
  EXPECT_GE(r->status, 500) << r->body;
  EXPECT_NE(r->body.find("rank 0 (tp 0, pp 0) failed"), std::string::npos) << r->body;
  ASSERT_TRUE(s->wait_exit(std::chrono::seconds(5))) << "serve stayed up with a dead executor:\n" << s->log();
  EXPECT_EQ(s->exit_code, 1);
  const std::string log = s->log();
  EXPECT_NE(log.find("rank 0 (tp 0, pp 0) failed"), std::string::npos) << log;
  EXPECT_NE(log.find("max_executor_restarts"), std::string::npos) << log;
}

// A raw client that sends a request and later hangs up without reading.
int send_and_hold(int port, const json& body) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  const std::string b = body.dump();
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(b.size()) + "\r\n\r\n" + b;
  if (send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) return -1;
  return fd;
}

// The per-connection hang-up signal frees KV at once: a non-streaming client
// that gives up mid-generation and a streaming client still waiting for a
// slot (it has received nothing yet) both disappear from /metrics, and the
// KV cache is empty again, within a second.
TEST_F(ServeFaults, AClientThatHangsUpFreesItsKvAtOnce) {
  auto s = start({"--max-num-seqs", "1"});
  ASSERT_GT(s->pid, 0);
  httplib::Client c("127.0.0.1", s->port);
  json long_request = {{"model", "m"}, {"prompt", json{5, 17, 230, 41, 9}}, {"max_tokens", 20000}, {"ignore_eos", true}};
  const int running = send_and_hold(s->port, long_request);
  ASSERT_GE(running, 0);
  json streaming = long_request;
  streaming["stream"] = true;
  const int waiting = send_and_hold(s->port, streaming);
  ASSERT_GE(waiting, 0);
  auto metrics = [&] {
    auto r = c.Get("/metrics");
    return r ? r->body : std::string();
  };
  auto until = [&](auto pred, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      if (pred(metrics())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(until([](const std::string& m) {
    return gauge(m, "vllm:num_requests_running") == 1 && gauge(m, "vllm:num_requests_waiting") == 1 &&
           gauge(m, "vllm:kv_cache_usage_perc") > 0;
  }, std::chrono::seconds(10))) << metrics();
  close(waiting);
  EXPECT_TRUE(until([](const std::string& m) { return gauge(m, "vllm:num_requests_waiting") == 0; },
                    std::chrono::seconds(1))) << metrics();
  EXPECT_EQ(gauge(metrics(), "vllm:num_requests_running"), 1);
  close(running);
  EXPECT_TRUE(until([](const std::string& m) {
    return gauge(m, "vllm:num_requests_running") == 0 && gauge(m, "vllm:kv_cache_usage_perc") == 0;
  }, std::chrono::seconds(1))) << metrics();
  EXPECT_EQ(s->stop(), 0) << s->log();
}

// Past --max-num-seqs running and --max-waiting-requests queued, a request
// gets an OpenAI-shaped 429 at once instead of an unbounded wait.
TEST_F(ServeFaults, BeyondTheWaitingBoundIs429) {
  auto s = start({"--max-num-seqs", "1", "--max-waiting-requests", "1"});
  ASSERT_GT(s->pid, 0);
  json long_request = {{"model", "m"}, {"prompt", json{5, 17, 230, 41, 9}}, {"max_tokens", 20000}, {"ignore_eos", true}};
  const int a = send_and_hold(s->port, long_request);
  const int b = send_and_hold(s->port, long_request);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  httplib::Client c("127.0.0.1", s->port);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    auto m = c.Get("/metrics");
    if (m && gauge(m->body, "vllm:num_requests_running") + gauge(m->body, "vllm:num_requests_waiting") == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto r = complete(s->port, 4);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 429) << r->body;
  json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["type"], "rate_limit_error") << r->body;
  EXPECT_EQ(e["code"], "queue_full") << r->body;
  close(a);
  close(b);
  EXPECT_EQ(s->stop(), 0) << s->log();
}

// Issue 21: an unset variable in a unit file (--api-key "$KEY") must not
// silently turn authentication off.
TEST_F(ServeFaults, AnEmptyApiKeyIsRefusedAtStart) {
  auto r = shardlm::testing::run_command("timeout 60 " + cli_ + " serve " + dir_ + " --api-key ''", true);
  EXPECT_EQ(r.rc, 2) << r.out;  // a usage error
  EXPECT_NE(r.out.find("an empty key would turn authentication off"), std::string::npos) << r.out;
  r = shardlm::testing::run_command("SHARDLM_API_KEY= timeout 60 " + cli_ + " serve " + dir_, true);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("$SHARDLM_API_KEY is set but empty"), std::string::npos) << r.out;
  r = shardlm::testing::run_command("timeout 60 " + cli_ + " router --backend http://127.0.0.1:1 --api-key ''", true);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("an empty key would turn authentication off"), std::string::npos) << r.out;
}

// Issue 21: the per-request work budgets are serve's flags; a request past
// one gets a 400 naming its flag, and the same server then serves normally.
TEST_F(ServeFaults, TheWorkBudgetsAreFlagsAndTheir400sNameThem) {
  auto s = start({"--chat-template-max-steps", "1000", "--grammar-table-memory", "64KiB", "--grammar-cache-memory", "1"});
  ASSERT_GT(s->pid, 0);
  httplib::Client c("127.0.0.1", s->port);
  c.set_read_timeout(30, 0);
  const auto chat = [&](const std::string& content, const json& extra) {
    json req = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 2}};
    req.update(extra);
    return c.Post("/v1/chat/completions", req.dump(), "application/json");
  };
  const auto expect_400_naming = [](const httplib::Result& r, const std::string& flag) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find(flag), std::string::npos) << r->body;
  };
  const auto expect_200 = [](const httplib::Result& r) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  };
  // A render charges a step per 64 bytes it copies: 256 KiB of content is past 1,000 steps.
  expect_200(chat("hi", json::object()));
  expect_400_naming(chat(std::string(256 << 10, 'x'), json::object()), "--chat-template-max-steps");
  expect_200(chat("hi", json::object()));
  // Stacked bounded repetitions grow the automaton with every byte: this one
  // compiles in 0.1 s within the default 64 MiB, and is past 64 KiB at once.
  expect_400_naming(chat("hi", {{"guided_regex", "(.{1,10}){3,6}"}}), "--grammar-table-memory");
  // Two small grammars fit the table budget; a 1-byte cache keeps only the newest.
  expect_200(chat("hi", {{"guided_regex", "[ab]{1,3}"}}));
  expect_200(chat("hi", {{"guided_choice", {"yes", "no"}}}));
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(gauge(m->body, "shardlm:grammar_cache_entries"), 1) << m->body;
  EXPECT_GT(gauge(m->body, "shardlm:grammar_cache_bytes"), 1) << m->body;
  EXPECT_EQ(s->stop(), 0) << s->log();
}

TEST_F(ServeFaults, ABadHookValueIsRefused) {
  auto r = shardlm::testing::run_command(cli_ + " serve " + dir_ + " --debug-fail-rank-at-batch x1", true);
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("expected RANK:BATCH"), std::string::npos) << r.out;
}

}  // namespace
