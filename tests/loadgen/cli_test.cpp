// `shardlm bench` end to end: the real binary (SHARDLM_CLI) against the
// scripted server in this process.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <nlohmann/json.hpp>

#include "fake_openai_server.h"

extern char** environ;

namespace shardlm::loadgen {
namespace {

using testing::FakeOpenAiServer;
using testing::FakeServerOptions;

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string temp_path(const std::string& name) {
  return std::string(::testing::TempDir()) + "/loadgen_cli_" + std::to_string(getpid()) + "_" + name;
}

// Starts the CLI with stdout/stderr in files; returns its pid.
pid_t spawn_cli(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  const char* cli = std::getenv("SHARDLM_CLI");
  if (cli == nullptr) cli = SHARDLM_CLI_PATH;
  std::vector<std::string> argv_s = {cli, "bench"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, cli, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("cannot start SHARDLM_CLI");
  return pid;
}

CliRun finish(pid_t pid, const std::string& out, const std::string& err) {
  int status = 0;
  waitpid(pid, &status, 0);
  CliRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

CliRun run_cli(const std::vector<std::string>& args) {
  std::string out = temp_path("out.txt"), err = temp_path("err.txt");
  return finish(spawn_cli(args, out, err), out, err);
}

TEST(BenchCli, PrintsVllmTableAndSavesVllmKeys) {
  FakeOpenAiServer server;  // 200 ms, then 20 ms, 10 tokens
  std::string json_path = temp_path("result.json");
  CliRun r = run_cli({"--base-url", server.base_url(), "--num-prompts", "6", "--max-concurrency", "3",
                   "--input-len", "16", "--output-len", "10", "--percentiles", "50,99", "--save-result",
                   json_path});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("============ Serving Benchmark Result ============\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Successful requests:                     6         \n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(r.out.find("-----Time per Output Token (excl. 1st token)------\n"), std::string::npos);
  EXPECT_NE(r.out.find("P99 ITL (ms):"), std::string::npos);
  EXPECT_NE(r.out.find("Maximum request concurrency:             3"), std::string::npos);
  EXPECT_NE(r.err.find("progress:"), std::string::npos) << r.err;  // not a TTY: plain lines

  auto j = nlohmann::json::parse(slurp(json_path));
  EXPECT_EQ(j["completed"], 6);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["model_id"], "fake-model");
  EXPECT_EQ(j["max_concurrency"], 3);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["total_output_tokens"], 60);
  // Never before the script (200 ms, then 20 ms); late by tens of ms on a
  // loaded machine. Counting the wait for a concurrency slot would give
  // about 400 ms to the second wave's three requests.
  for (const char* key : {"mean_ttft_ms", "p99_ttft_ms"}) {
    EXPECT_GE(j[key].get<double>(), 198.0) << key;
    EXPECT_LE(j[key].get<double>(), 260.0) << key;
  }
  EXPECT_NEAR(j["median_tpot_ms"].get<double>(), 20.0, 1.6);
  EXPECT_NEAR(j["mean_itl_ms"].get<double>(), 20.0, 3.0);
  EXPECT_NEAR(j["p50_itl_ms"].get<double>(), 20.0, 1.6);
  for (const char* key : {"std_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "duration",
                          "request_throughput", "output_throughput", "total_token_throughput",
                          "max_output_tokens_per_s", "max_concurrent_requests", "total_input_tokens"})
    EXPECT_TRUE(j.contains(key)) << key;
  ASSERT_EQ(j["ttfts"].size(), 6u);
  ASSERT_EQ(j["itls"].size(), 6u);
  EXPECT_EQ(j["itls"][0].size(), 9u);
  EXPECT_EQ(j["input_lens"], nlohmann::json::array({42, 42, 42, 42, 42, 42}));
  EXPECT_EQ(j["output_lens"], nlohmann::json::array({10, 10, 10, 10, 10, 10}));
  EXPECT_EQ(j["errors"][0], "");
}

TEST(BenchCli, CompletionsEndpointWithTokenIds) {
  FakeServerOptions so;
  so.first_token_ms = 100;
  so.n_tokens = 5;
  FakeOpenAiServer server(so);
  CliRun r = run_cli({"--base-url", server.base_url(), "--endpoint", "completions", "--prompt-token-ids",
                   "--vocab-size", "2000", "--num-prompts", "2", "--input-len", "32", "--range-ratio", "0",
                   "--model", "m1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const auto& b : server.bodies()) {
    EXPECT_EQ(b["prompt"].size(), 32u);
    EXPECT_EQ(b["model"], "m1");
  }
  for (const auto& p : server.paths()) EXPECT_EQ(p, "/v1/completions");
  EXPECT_NE(r.out.find("Successful requests:                     2"), std::string::npos) << r.out;
}

TEST(BenchCli, JsonlAndSharedPrefixDatasetsReachTheServer) {
  FakeServerOptions so;
  so.first_token_ms = 10;
  so.token_interval_ms = 5;
  so.n_tokens = 3;
  {
    FakeOpenAiServer server(so);
    std::string path = temp_path("prompts.jsonl");
    std::ofstream(path) << "{\"prompt\": \"first prompt\", \"output_len\": 5}\n"
                        << "{\"conversations\": [{\"from\": \"human\", \"value\": \"second prompt\"}]}\n";
    CliRun r = run_cli({"--base-url", server.base_url(), "--dataset", path, "--num-prompts", "2",
                        "--max-concurrency", "1", "--output-len", "9"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    auto bodies = server.bodies();
    ASSERT_EQ(bodies.size(), 2u);
    EXPECT_EQ(bodies[0]["messages"][0]["content"], "first prompt");
    EXPECT_EQ(bodies[0]["max_completion_tokens"], 5);
    EXPECT_EQ(bodies[1]["messages"][0]["content"], "second prompt");
    EXPECT_EQ(bodies[1]["max_completion_tokens"], 9);
    EXPECT_FALSE(bodies[0].contains("ignore_eos"));  // only for synthetic prompts
  }
  {
    FakeOpenAiServer server(so);
    CliRun r = run_cli({"--base-url", server.base_url(), "--dataset", "shared-prefix", "--num-prompts", "8",
                        "--num-prefixes", "2", "--prefix-len", "20", "--input-len", "5"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    std::set<std::string> prefixes;
    for (const auto& b : server.bodies()) {
      std::string text = b["messages"][0]["content"];
      size_t cut = 0;
      for (int w = 0; w < 20; ++w) cut = text.find(' ', cut) + 1;
      prefixes.insert(text.substr(0, cut));
      EXPECT_EQ(b["ignore_eos"], true);
    }
    EXPECT_EQ(prefixes.size(), 2u);
  }
}

TEST(BenchCli, DeadServerExitsOneWithAClearMessage) {
  int port = testing::dead_port();
  CliRun r = run_cli({"--base-url", "http://127.0.0.1:" + std::to_string(port), "--num-prompts", "3"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot connect to http://127.0.0.1:" + std::to_string(port) +
                       ": connection refused \xE2\x80\x94 is the server running?"),
            std::string::npos)
      << r.err;
}

TEST(BenchCli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_cli({"--endpoint", "embeddings"}).exit_code, 2);
  EXPECT_EQ(run_cli({"--plot", "x.png"}).exit_code, 2);
  CliRun r = run_cli({"--request-rate", "fast"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--request-rate"), std::string::npos);
}

TEST(BenchCli, SigintPrintsWhatWasMeasured) {
  FakeServerOptions so;
  so.first_token_ms = 50;
  so.token_interval_ms = 50;
  so.n_tokens = 6;
  FakeOpenAiServer server(so);
  std::string out = temp_path("int_out.txt"), err = temp_path("int_err.txt"), json_path = temp_path("int.json");
  pid_t pid = spawn_cli({"--base-url", server.base_url(), "--num-prompts", "40", "--max-concurrency", "2",
                         "--input-len", "8", "--save-result", json_path},
                        out, err);
  // With --max-concurrency 2, request 5 leaves only after 3 have completed:
  // its arrival means "some were measured, most were not", whatever the
  // machine's speed (an ASan binary can take a second just to start).
  if (!server.wait_for_requests(5)) {
    kill(pid, SIGKILL);
    finish(pid, out, err);
    FAIL() << "waited 120 s for `shardlm bench` to send its 5th request; the server saw " << server.n_requests();
  }
  kill(pid, SIGINT);
  CliRun r = finish(pid, out, err);
  EXPECT_EQ(r.exit_code, 130) << r.out << r.err;
  EXPECT_NE(r.out.find("Interrupted after"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Serving Benchmark Result"), std::string::npos);
  auto j = nlohmann::json::parse(slurp(json_path));
  EXPECT_TRUE(j["interrupted"].get<bool>());
  EXPECT_GE(j["completed"].get<int>(), 2);
  EXPECT_LT(j["completed"].get<int>(), 40);
}

TEST(BenchCli, SweepPrintsTableAndRendersPng) {
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not installed";
  FakeServerOptions so;
  so.first_token_ms = 30;
  so.token_interval_ms = 5;
  so.n_tokens = 5;
  FakeOpenAiServer server(so);
  std::string png = temp_path("sweep.png");
  CliRun r = run_cli({"--base-url", server.base_url(), "--num-prompts", "4", "--input-len", "8",
                   "--sweep-concurrency", "1,2,4", "--plot", png});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("concurrency      req/s    output tok/s   p99 TTFT (ms)   p99 TPOT (ms)"),
            std::string::npos)
      << r.out;
  std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_EQ(bytes.substr(1, 3), "PNG");
  EXPECT_EQ(server.n_requests(), 12);
}

// A sweep's later points draw new prompts: replaying point 0's would measure
// the server's prefix cache, not its prefill. Point 0 keeps --seed's prompts.
TEST(BenchCli, SweepPointsDrawTheirOwnPrompts) {
  FakeServerOptions so;
  so.n_tokens = 2;
  FakeOpenAiServer server(so);
  CliRun r = run_cli({"--base-url", server.base_url(), "--num-prompts", "3", "--input-len", "16",
                      "--sweep-concurrency", "1,1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<nlohmann::json> bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 6u);
  auto prompts_of = [&](size_t begin) {
    std::vector<std::string> p;
    for (size_t i = begin; i < begin + 3; ++i) {
      const nlohmann::json& b = bodies[i];
      p.push_back(b.contains("messages") ? b["messages"].dump() : b["prompt"].dump());
    }
    std::sort(p.begin(), p.end());
    return p;
  };
  const std::vector<std::string> first = prompts_of(0), second = prompts_of(3);
  for (const std::string& p : second)
    EXPECT_FALSE(std::binary_search(first.begin(), first.end(), p)) << "point 1 replays point 0's prompt " << p;
  // The same seed gives point 0 the same prompts as a run without a sweep.
  FakeOpenAiServer single(so);
  CliRun r1 = run_cli({"--base-url", single.base_url(), "--num-prompts", "3", "--input-len", "16"});
  ASSERT_EQ(r1.exit_code, 0) << r1.out << r1.err;
  bodies = single.bodies();
  ASSERT_EQ(bodies.size(), 3u);
  EXPECT_EQ(prompts_of(0), first);
}

}  // namespace
}  // namespace shardlm::loadgen
