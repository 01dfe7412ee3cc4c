// Timing accuracy against a scripted server: first token after 200 ms, then
// one every 20 ms. What the client measured is compared with what the server
// really did (the fake server records when each request arrived and when
// each token's write returned), never with the machine's speed: a loaded
// machine makes the server's sleeps late, and the client must see exactly
// that lateness plus two loopback transits. The metrics are also checked
// against the client's own per-request samples, which catches the wrong
// formula (a TPOT over n instead of n - 1) with no timing tolerance at all.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>

#include "fake_openai_server.h"
#include "loadgen/arrivals.h"
#include "loadgen/runner.h"

namespace shardlm::loadgen {
namespace {

using testing::FakeOpenAiServer;
using testing::FakeServerOptions;

void expect_within(double measured, double expected, double rel, const char* what) {
  EXPECT_NEAR(measured, expected, expected * rel) << what;
}

// The server sleeps until its schedule, so no latency is ever below the script.
void expect_not_before_script(double measured, double scripted, const char* what) {
  EXPECT_GE(measured, scripted * 0.99) << what;
}

// Two loopback transits (request in, token out) on a loaded 2-core machine
// under ASan: tens of milliseconds at worst. Waiting for a concurrency slot
// (a TTFT on the wrong clock) costs a whole wave, hundreds of milliseconds.
constexpr double kTransitSlackS = 0.1;

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string prompt_key(const nlohmann::json& body) {
  if (body.contains("messages")) return body["messages"][0]["content"].dump();
  return body["prompt"].dump();
}

std::string prompt_key(const SampleRequest& r, bool chat) {
  if (chat || r.prompt_ids.empty()) return nlohmann::json(r.prompt).dump();
  return nlohmann::json(r.prompt_ids).dump();
}

// Each request's TTFT, ITLs and E2EL against the server's timeline of the
// same request: sent <= arrived <= token_sent[i] <= received, so the client
// is never faster than the server, and slower only by the transits.
void expect_matches_server(const BenchmarkResult& r, const std::vector<SampleRequest>& requests,
                           FakeOpenAiServer& server, bool chat) {
  std::map<std::string, FakeOpenAiServer::Timeline> by_prompt;
  for (auto& t : server.timelines()) by_prompt[prompt_key(t.body)] = t;
  ASSERT_EQ(by_prompt.size(), requests.size()) << "prompts must be distinct to match requests";
  ASSERT_EQ(r.outputs.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto it = by_prompt.find(prompt_key(requests[i], chat));
    ASSERT_NE(it, by_prompt.end()) << "request " << i << " never reached the server";
    const auto& t = it->second;
    const RequestOutput& o = r.outputs[i];
    ASSERT_TRUE(o.success) << o.error;
    ASSERT_EQ(o.itl.size() + 1, t.token_sent.size()) << "request " << i;
    const double server_ttft = seconds_between(t.arrived, t.token_sent.front());
    EXPECT_GE(o.ttft, server_ttft) << "request " << i << ": the client saw a token before it was sent";
    EXPECT_LE(o.ttft, server_ttft + kTransitSlackS) << "request " << i << ": TTFT counts more than the request";
    const double server_e2el = seconds_between(t.arrived, t.token_sent.back());
    EXPECT_GE(o.latency, server_e2el) << "request " << i;
    EXPECT_LE(o.latency, server_e2el + kTransitSlackS) << "request " << i;
    for (size_t k = 0; k < o.itl.size(); ++k) {
      const double server_gap = seconds_between(t.token_sent[k], t.token_sent[k + 1]);
      EXPECT_NEAR(o.itl[k], server_gap, kTransitSlackS) << "request " << i << " gap " << k;
    }
  }
}

// The summary is the mean of the per-request samples, each TPOT over the
// n - 1 gaps after the first token: exact, from the client's own data.
void expect_metrics_from_samples(const BenchmarkResult& r) {
  double ttft = 0, tpot = 0, e2el = 0, itl = 0;
  size_t n_tpot = 0, n_itl = 0, n = 0;
  for (const auto& o : r.outputs) {
    if (!o.success) continue;
    ++n;
    ttft += o.ttft;
    e2el += o.latency;
    const double gaps = std::accumulate(o.itl.begin(), o.itl.end(), 0.0);
    EXPECT_NEAR(gaps, o.latency - o.ttft, 1e-9);
    // n: the tokens usage reported, else the chunks that carried choices.
    const int64_t n_out = o.usage_reported && o.output_tokens > 0 ? o.output_tokens : o.n_chunks;
    if (n_out > 1) {
      tpot += gaps / static_cast<double>(n_out - 1);
      ++n_tpot;
    }
    for (double g : o.itl) itl += g, ++n_itl;
  }
  ASSERT_GT(n, 0u);
  const auto& m = r.metrics;
  EXPECT_NEAR(m.ttft.mean_ms, 1000 * ttft / n, 1e-6);
  EXPECT_NEAR(m.e2el.mean_ms, 1000 * e2el / n, 1e-6);
  if (n_tpot) EXPECT_NEAR(m.tpot.mean_ms, 1000 * tpot / n_tpot, 1e-6);
  if (n_itl) EXPECT_NEAR(m.itl.mean_ms, 1000 * itl / n_itl, 1e-6);
}

std::vector<SampleRequest> small_random(int64_t n, bool ids = false) {
  RandomDatasetOptions o;
  o.n_prompts = n;
  o.input_len = 16;
  o.output_len = 10;
  o.range_ratio = 0.0;
  o.token_ids = ids;
  o.vocab_size = 4000;
  return make_random_dataset(o);
}

TEST(Accuracy, ChatTimingsMatchTheScript) {
  FakeOpenAiServer server;  // 200 ms, then 20 ms, 10 tokens
  BenchConfig c;
  c.base_url = server.base_url();
  c.max_concurrency = 4;
  c.ignore_eos = true;
  auto requests = small_random(8);
  BenchmarkResult r = run_benchmark(c, requests);
  const auto& m = r.metrics;
  EXPECT_EQ(r.model, "fake-model");  // from GET /v1/models
  ASSERT_EQ(m.completed, 8);
  EXPECT_EQ(m.failed, 0);
  EXPECT_EQ(m.total_output, 80);      // usage.completion_tokens
  EXPECT_EQ(m.total_input, 8 * 42);   // usage.prompt_tokens
  EXPECT_EQ(m.n_usage_missing, 0);
  expect_not_before_script(m.ttft.mean_ms, 200.0, "mean TTFT");
  expect_not_before_script(m.ttft.median_ms, 200.0, "median TTFT");
  expect_not_before_script(m.e2el.mean_ms, 380.0, "mean E2EL");
  expect_matches_server(r, requests, server, /*chat=*/true);
  expect_metrics_from_samples(r);
  for (const auto& o : r.outputs) EXPECT_EQ(o.itl.size(), 9u);
  EXPECT_EQ(m.max_concurrent_requests, 4);
  expect_not_before_script(r.duration_s, 0.76, "two waves of 380 ms");
  expect_within(m.output_throughput, 80 / r.duration_s, 1e-9, "output throughput");
  EXPECT_EQ(r.outputs[0].generated_text, " tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 tok8 tok9");

  auto bodies = server.bodies();
  auto paths = server.paths();
  ASSERT_EQ(bodies.size(), 8u);
  for (size_t i = 0; i < bodies.size(); ++i) {
    const auto& b = bodies[i];
    EXPECT_EQ(paths[i], "/v1/chat/completions");
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["max_completion_tokens"], 10);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["messages"][0]["role"], "user");
  }
}

TEST(Accuracy, CompletionsWithTokenIdsAndApiKey) {
  FakeServerOptions so;
  so.n_tokens = 8;
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url() + "/v1";  // the SDK-style URL works too
  c.model = "given-name";
  c.endpoint = Endpoint::kCompletions;
  c.client.api_key = "sk-test";
  c.extra_body = {{"temperature", 0}};
  auto requests = small_random(4, /*ids=*/true);
  BenchmarkResult r = run_benchmark(c, requests);
  const auto& m = r.metrics;
  ASSERT_EQ(m.completed, 4);
  expect_not_before_script(m.ttft.mean_ms, 200.0, "mean TTFT");
  expect_matches_server(r, requests, server, /*chat=*/false);
  expect_metrics_from_samples(r);
  EXPECT_EQ(m.total_output, 32);
  for (const auto& path : server.paths()) EXPECT_EQ(path, "/v1/completions");
  for (const auto& auth : server.auth_headers()) EXPECT_EQ(auth, "Bearer sk-test");
  auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 4u);
  for (const auto& b : bodies) {
    EXPECT_EQ(b["model"], "given-name");
    EXPECT_EQ(b["max_tokens"], 10);
    EXPECT_EQ(b["temperature"], 0);
    EXPECT_FALSE(b.contains("ignore_eos"));
    ASSERT_TRUE(b["prompt"].is_array());
    EXPECT_EQ(b["prompt"].size(), 16u);
  }
  EXPECT_EQ(r.outputs[0].generated_text, " tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7");
}

TEST(Accuracy, WithoutUsageOutputTokensFallBackToChunks) {
  FakeServerOptions so;
  so.first_token_ms = 50;
  so.token_interval_ms = 20;
  so.n_tokens = 5;
  so.send_usage = false;
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url();
  auto requests = small_random(2);
  BenchmarkResult r = run_benchmark(c, requests);
  EXPECT_EQ(r.metrics.completed, 2);
  EXPECT_EQ(r.metrics.n_usage_missing, 2);
  EXPECT_EQ(r.metrics.total_output, 10);
  EXPECT_EQ(r.metrics.total_input, 2 * 16);  // our estimate when usage is absent
  // Counting chunks instead of tokens still gives the right TPOT when each
  // chunk is one token (the timing itself is checked in the tests above).
  for (const auto& o : r.outputs) EXPECT_EQ(o.n_chunks, 5);
  expect_metrics_from_samples(r);
}

TEST(Accuracy, PoissonRequestsLeaveOnSchedule) {
  FakeServerOptions so;
  so.first_token_ms = 5;
  so.token_interval_ms = 5;
  so.n_tokens = 2;
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url();
  c.request_rate = 25.0;
  c.seed = 3;
  auto requests = small_random(25);
  BenchmarkResult r = run_benchmark(c, requests);
  ASSERT_EQ(r.metrics.completed, 25);
  auto expected = poisson_arrival_times(25, 25.0, 3);
  for (size_t i = 0; i < expected.size(); ++i) {  // late by tens of ms on a loaded machine
    EXPECT_GE(r.outputs[i].start_time, expected[i] - 0.03) << "request " << i;
    EXPECT_LE(r.outputs[i].start_time, expected[i] + 0.06) << "request " << i;
  }
  // The last request leaves at its arrival time and takes 10 ms.
  EXPECT_GE(r.duration_s, expected.back());
  EXPECT_LE(r.duration_s, expected.back() + 0.15);
}

}  // namespace
}  // namespace shardlm::loadgen

namespace shardlm::loadgen {
namespace {

// Without usage, a tokenizer (bench --tokenizer) counts the generated text:
// here a counter of space-separated words, so " tok0 ... tok4" is 5 tokens
// per request although the server streamed them in 5 chunks of its choosing.
TEST(Accuracy, WithoutUsageATokenizerCountsTheOutput) {
  FakeServerOptions so;
  so.first_token_ms = 20;
  so.token_interval_ms = 5;
  so.n_tokens = 5;
  so.send_usage = false;
  FakeOpenAiServer server(so);
  BenchConfig c;
  c.base_url = server.base_url();
  int calls = 0;
  c.count_output_tokens = [&calls](const std::string& text) {
    ++calls;
    int64_t words = 0;
    bool in_word = false;
    for (char ch : text) {
      if (ch != ' ' && !in_word) ++words;
      in_word = ch != ' ';
    }
    return words * 2;  // pretend each word is two tokens: proves the counter is used
  };
  BenchmarkResult r = run_benchmark(c, small_random(2));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(r.metrics.n_usage_missing, 0);
  EXPECT_EQ(r.metrics.total_output, 2 * 10);
}

}  // namespace
}  // namespace shardlm::loadgen
