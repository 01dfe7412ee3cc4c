#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fake_openai_server.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"

namespace shardlm::loadgen {
namespace {

using testing::FakeOpenAiServer;
using testing::FakeServerOptions;

std::vector<SampleRequest> tiny(int64_t n) {
  RandomDatasetOptions o;
  o.n_prompts = n;
  o.input_len = 8;
  o.output_len = 4;
  o.range_ratio = 0.0;
  return make_random_dataset(o);
}

FakeServerOptions fast() {
  FakeServerOptions so;
  so.first_token_ms = 10;
  so.token_interval_ms = 5;
  so.n_tokens = 4;
  return so;
}

TEST(Robustness, ServerErrorsAreCountedAndTheRunGoesOn) {
  FakeServerOptions so = fast();
  so.fail_every = 3;
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url();
  c.max_concurrency = 2;
  BenchmarkResult r = run_benchmark(c, tiny(9));
  EXPECT_EQ(r.metrics.completed, 6);
  EXPECT_EQ(r.metrics.failed, 3);
  int n_500 = 0;
  for (const auto& o : r.outputs)
    if (!o.success) {
      EXPECT_EQ(o.error, "HTTP 500: scripted failure");
      ++n_500;
    }
  EXPECT_EQ(n_500, 3);
  std::string notes = format_notes(r);
  EXPECT_NE(notes.find("Failed requests during benchmark run detected"), std::string::npos);
  EXPECT_NE(notes.find("Error 2: HTTP 500: scripted failure"), std::string::npos);
  std::string table = format_result_table(r);
  EXPECT_NE(table.find("Failed requests:                         3         \n"), std::string::npos) << table;
  auto j = result_to_json(r);
  EXPECT_EQ(j["failed"], 3);
  EXPECT_EQ(j["errors"].size(), 9u);
}

TEST(Robustness, DeadServerSaysSo) {
  int port = testing::dead_port();
  BenchConfig c;
  c.base_url = "http://127.0.0.1:" + std::to_string(port);
  try {
    run_benchmark(c, tiny(2));
    FAIL() << "no error for a dead server";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot connect to http://127.0.0.1:" + std::to_string(port) +
                                         ": connection refused \xE2\x80\x94 is the server running?");
  }
}

TEST(Robustness, BadUrlsAreRejectedWithTheFlagName) {
  EXPECT_THROW(parse_server_url("127.0.0.1:8000"), Error);
  EXPECT_THROW(parse_server_url("ftp://x"), Error);
  EXPECT_THROW(parse_server_url("http://h:99999"), Error);
  ServerUrl u = parse_server_url("http://[::1]:9/api/v1/");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 9);
  EXPECT_EQ(u.path_prefix, "/api");
  EXPECT_EQ(u.origin(), "http://[::1]:9");
  try {
    parse_server_url("localhost:8000");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--base-url"), std::string::npos);
  }
}

TEST(Robustness, SilentServerTimesOut) {
  FakeServerOptions so = fast();
  so.first_token_ms = 700;
  so.n_tokens = 1;
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url();
  c.model = "m";
  c.client.read_timeout_s = 0.2;
  BenchmarkResult r = run_benchmark(c, tiny(1));
  EXPECT_EQ(r.metrics.failed, 1);
  EXPECT_NE(r.outputs[0].error.find("Read"), std::string::npos) << r.outputs[0].error;
  EXPECT_LT(r.duration_s, 0.6);
}

TEST(Robustness, StopFlagEndsTheRunWithWhatWasMeasured) {
  FakeServerOptions so = fast();
  so.first_token_ms = 50;
  so.token_interval_ms = 50;
  so.n_tokens = 12;  // 600 ms per request
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url();
  c.max_concurrency = 2;
  std::atomic<bool> stop{false};
  RunHooks hooks;
  hooks.stop = &stop;
  int n_progress = 0;
  std::chrono::steady_clock::time_point stopped_at;
  // The stop comes once the first wave of two is done: the second wave is
  // then in flight, 600 ms from its end, and must be cut off, not awaited.
  hooks.on_progress = [&](const ProgressSnapshot& s) {
    ++n_progress;
    EXPECT_EQ(s.n_total, 20);
    if (s.n_done >= 2 && !stop) {
      stopped_at = std::chrono::steady_clock::now();
      stop = true;
    }
  };
  BenchmarkResult r = run_benchmark(c, tiny(20), hooks);
  const double after_stop = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  ASSERT_TRUE(stop);
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(after_stop, 0.4);
  EXPECT_EQ(r.metrics.completed, 2);
  EXPECT_EQ(r.metrics.failed, 0);  // cut-off requests are not failures
  EXPECT_EQ(r.n_not_completed, 18);
  EXPECT_GT(n_progress, 2);
  EXPECT_NE(format_notes(r).find("Interrupted"), std::string::npos);
}

}  // namespace
}  // namespace shardlm::loadgen
