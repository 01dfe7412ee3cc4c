// `shardlm serve` as a user runs it, on a synthetic checkpoint with
// Qwen2.5-7B's attention shapes (28 Q heads, 4 KV heads, head_dim 128,
// hidden 3584): every layout the seeds wanted for a 6-GPU box — -tp 6 (which
// vLLM refuses), -tp 4 (two idle), -tp 2 -pp 3, -dp 3 -tp 2 — answers with
// the greedy text of -tp 1, and its startup log shows each rank allocated
// what plan predicted.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/units.h"
#include "support/process.h"

namespace {

using json = nlohmann::json;

using shardlm::testing::env_or;
using shardlm::with_commas;

struct ServeProcess {
  pid_t pid = -1;
  int exit_code = -1;  // when it exited by itself
  int port = 0;
  std::string log_path;
  ~ServeProcess() { stop(); }
  int stop() {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::string log() const {
    std::ifstream in(log_path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

class ServeLayouts : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cli_ = env_or("SHARDLM_CLI", "shardlm");
    dir_ = env_or("SHARDLM_BINARY_DIR", "/tmp") + "/tests/server/qwen7b_heads." + std::to_string(getpid());
    std::string cmd = cli_ + " make-model --like qwen2.5-7b --layers 3 --vocab 512 --intermediate 512 --seed 5 --out " + dir_ +
                      " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  // Starts serve with extra flags; waits until /health answers 200.
  std::unique_ptr<ServeProcess> start(const std::vector<std::string>& flags, bool expect_exit = false,
                                      const std::string& model_dir = dir_, const std::string& kv_memory = "32MiB") {
    auto p = std::make_unique<ServeProcess>();
    p->port = shardlm::testing::free_loopback_port();
    p->log_path = dir_ + "/serve." + std::to_string(p->port) + ".log";
    std::vector<std::string> args = {cli_, "serve", model_dir, "--port", std::to_string(p->port), "--served-model-name",
                                     "q7"};
    if (!kv_memory.empty()) args.insert(args.end(), {"--kv-cache-memory", kv_memory});  // "": sized from the flags
    args.insert(args.end(), flags.begin(), flags.end());
    p->pid = shardlm::testing::spawn_logged(args, p->log_path);
    httplib::Client c("127.0.0.1", p->port);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return p;
      int status = 0;
      if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
        p->pid = -1;
        p->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (!expect_exit) ADD_FAILURE() << "serve exited during start-up:\n" << p->log();
        return p;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "serve did not become healthy:\n" << p->log();
    return p;
  }

  static std::string complete(int port, const json& prompt_ids) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    json req = {{"model", "q7"}, {"prompt", prompt_ids}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}};
    auto r = c.Post("/v1/completions", req.dump(), "application/json");
    if (!r) return "no response";
    if (r->status != 200) return "status " + std::to_string(r->status) + ": " + r->body;
    return json::parse(r->body)["choices"][0]["text"].get<std::string>();
  }

  static std::string cli_, dir_;
};
std::string ServeLayouts::cli_, ServeLayouts::dir_;

TEST_F(ServeLayouts, SixDeviceLayoutsGiveTheTp1Text) {
  const json prompts = {json{5, 17, 230, 41, 9}, json{300, 2, 2, 77}};
  std::vector<std::string> expected;
  {
    auto tp1 = start({});
    ASSERT_GT(tp1->pid, 0);
    for (const auto& p : prompts) expected.push_back(complete(tp1->port, p));
    EXPECT_EQ(tp1->stop(), 0) << tp1->log();
  }
  for (const auto& e : expected) ASSERT_FALSE(e.rfind("status", 0) == 0 || e == "no response") << e;
  const std::vector<std::vector<std::string>> layouts = {
      {"-tp", "6"}, {"-tp", "4"}, {"-tp", "2", "-pp", "3"}, {"-dp", "3", "-tp", "2"}};
  for (const auto& layout : layouts) {
    std::string name;
    for (const auto& f : layout) name += f + " ";
    auto s = start(layout);
    ASSERT_GT(s->pid, 0) << name;
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(complete(s->port, prompts[i]), expected[i]) << name;
    const std::string log = s->log();
    EXPECT_EQ(log.find("DIFFERS from plan"), std::string::npos) << name << "\n" << log;
    EXPECT_NE(log.find("(as planned)"), std::string::npos) << name << "\n" << log;
    EXPECT_EQ(s->stop(), 0) << name << "\n" << s->log();
  }
}

// GET /v1/deployment and /metrics report every rank of every replica:
// plan's bytes as the startup log prints them, and beside them what the
// rank's allocator obtained (the log's "allocated (measured)" figure).
TEST_F(ServeLayouts, DeploymentAndMetricsReportEveryRankOfEveryReplica) {
  auto s = start({"-dp", "2", "-tp", "2"});
  ASSERT_GT(s->pid, 0);
  ASSERT_FALSE(complete(s->port, json{5, 17, 230, 41, 9}).empty());
  httplib::Client c("127.0.0.1", s->port);
  auto r = c.Get("/v1/deployment");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json d = json::parse(r->body);
  EXPECT_EQ(d["layout"], json({{"tp", 2}, {"pp", 1}, {"dp", 2}, {"ep", 1}}));
  EXPECT_EQ(d["n_heads"], 28);
  ASSERT_EQ(d["ranks"].size(), 4u);
  const std::string log = s->log();
  const std::string metrics = c.Get("/metrics")->body;
  for (const json& rank : d["ranks"]) {
    const int64_t planned = rank["planned"]["weights"], measured = rank["measured"]["weights"];
    EXPECT_NE(log.find("(" + with_commas(planned) + " B)"), std::string::npos) << rank.dump();
    EXPECT_NE(log.find("allocated (measured): weights " + with_commas(measured) + " B"), std::string::npos) << rank.dump();
    EXPECT_EQ(rank["measured"]["kv_cache"], rank["planned"]["kv_cache"]);
    EXPECT_TRUE(rank["measured"]["workspace"].is_null());
    EXPECT_EQ(rank["q_heads"]["count"], 14);
    const std::string labels = "replica=\"" + std::to_string(rank["replica"].get<int>()) + "\",rank=\"" +
                               std::to_string(rank["rank"].get<int>()) + "\"";
    EXPECT_NE(metrics.find(labels + ",tp_rank=\"" + std::to_string(rank["tp_rank"].get<int>()) +
                           "\",pp_rank=\"0\",kind=\"weights\",source=\"measured\"} " + std::to_string(measured)),
              std::string::npos) << labels << "\n" << metrics;
  }
  EXPECT_NE(metrics.find("# TYPE shardlm:kv_blocks_in_use_peak gauge"), std::string::npos);
  // The completion ran on one replica: its ranks' peak is above zero.
  EXPECT_NE(metrics.find("shardlm:kv_blocks_in_use_peak{"), std::string::npos);
  bool any_peak = false;
  for (size_t pos = 0; (pos = metrics.find("shardlm:kv_blocks_in_use_peak{", pos)) != std::string::npos; ++pos) {
    const size_t sp = metrics.find("} ", pos);
    any_peak |= std::stoll(metrics.substr(sp + 2)) > 0;
  }
  EXPECT_TRUE(any_peak) << metrics;
  EXPECT_EQ(s->stop(), 0) << s->log();
}

// Sliding window on every layer (Mistral v0.1's shape, window 8): serve sizes
// max-model-len with plan's kv_tokens_per_sequence, so a KV pool of 128
// tokens (64 KiB at 512 B/token: 8 blocks of 16) serves the model's full
// 32,768 positions, and a 5 + 200 token completion runs in it: its blocks
// are released as they leave the window (at most ceil((7 + 16) / 16) + 1 = 3),
// with the text of generate, which keeps every block.
TEST_F(ServeLayouts, SlidingWindowModelServesPastItsKvPool) {
  const std::string model = dir_ + "/mistral_window";
  const std::string cmd = cli_ + " make-model --like mistral-7b --layers 2 --vocab 512 --hidden 128 --heads 4 " +
                          "--kv-heads 2 --head-dim 32 --intermediate 256 --sliding-window 8 --seed 3 --out " + model +
                          " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto s = start({"--max-num-batched-tokens", "16", "--batch-invariant"}, false, model, "64KiB");
  ASSERT_GT(s->pid, 0);
  const std::string log = s->log();
  EXPECT_NE(log.find("KV cache holds 128 tokens per replica (512 B/token on rank 0); max model len 32,768 tokens; "
                     "sliding window of 8 positions on every layer: blocks that leave it are released, so a sequence "
                     "of max model len holds at most 48 tokens; max concurrency at max model len: 2 sequences"),
            std::string::npos) << log;
  httplib::Client c("127.0.0.1", s->port);
  c.set_read_timeout(120, 0);
  json req = {{"model", "q7"}, {"prompt", json{5, 17, 230, 41, 9}}, {"max_tokens", 200}, {"temperature", 0},
              {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 200);
  // The text of generate, whose cache keeps every block (and which tests/reference checks against numpy).
  const std::string gen_out = dir_ + "/mistral_window.generate.json";
  const std::string gen = cli_ + " generate " + model + " --prompt-ids 5,17,230,41,9 --max-tokens 200 --json " +
                          "--kv-cache-dtype bf16 --batch-invariant > " + gen_out + " 2>/dev/null";
  ASSERT_EQ(std::system(gen.c_str()), 0);
  std::ifstream gen_in(gen_out);
  const json g = json::parse(std::string(std::istreambuf_iterator<char>(gen_in), {}));
  ASSERT_EQ(g["token_ids"].size(), 200u);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], g["text"]);
  const std::string metrics = c.Get("/metrics")->body;
  const size_t at = metrics.find("shardlm:kv_blocks_in_use_peak{");
  ASSERT_NE(at, std::string::npos) << metrics;
  const int64_t peak = std::stoll(metrics.substr(metrics.find("} ", at) + 2));
  EXPECT_GE(peak, 2);
  EXPECT_LE(peak, 3);
  // 204 positions stored in 13 blocks of 16, all but the last window's released.
  const size_t slid = metrics.find("shardlm:kv_blocks_slid_total{");
  ASSERT_NE(slid, std::string::npos) << metrics;
  EXPECT_GE(std::stoll(metrics.substr(metrics.find("} ", slid) + 2)), 10) << metrics;
  EXPECT_EQ(s->stop(), 0) << s->log();
  // The same shapes without the window (Mistral v0.3): that pool cannot hold the context asked for.
  const std::string full = dir_ + "/mistral_full";
  const std::string cmd_full = cli_ + " make-model --like mistral-7b --layers 2 --vocab 512 --hidden 128 --heads 4 " +
                               "--kv-heads 2 --head-dim 32 --intermediate 256 --seed 3 --out " + full + " > /dev/null";
  ASSERT_EQ(std::system(cmd_full.c_str()), 0);
  auto refused = start({"--max-num-batched-tokens", "16", "--max-model-len", "32768"}, true, full, "64KiB");
  EXPECT_LT(refused->pid, 0);
  EXPECT_NE(refused->log().find("--max-model-len 32768 needs 32768 tokens of KV cache for one sequence, but the KV "
                                "cache holds 128 tokens"),
            std::string::npos) << refused->log();
}

// Gemma 3's shape (6 layers, 0-4 local with a window of 5, layer 5 global)
// at TP 3 x PP 2: the local layers get a pool of their own, sized by plan's
// local_pool_blocks (4 sequences x (ceil(4 / 16) + 2) + ceil(16 / 16) = 13
// blocks of 16), the global layer's pool the rest. Each rank's measured KV
// bytes equal plan's, two pools: stage 0 (layers 0-2, all local) allocates
// 13 x 16 x 768 B (3 layers x K and V x 64 x bf16 per token) = 159,744 B and
// no global pool; stage 1 (layers 3-4 local, 5 global) 13 x 16 x 512 B =
// 106,496 B, and (4 MiB - 106,496) / (16 x 256 B) = 998 global blocks,
// 4,194,304 B in all. A
// 5 + 60 token completion, its local blocks released as they leave the
// window, has the text of generate, which keeps every block in one pool.
TEST_F(ServeLayouts, Gemma3LocalLayersServeFromTheirOwnPool) {
  const std::string model = dir_ + "/gemma3_hybrid";
  const std::string cmd = cli_ + " make-model --like gemma-3-1b --layers 6 --vocab 512 --hidden 320 --heads 4 " +
                          "--kv-heads 1 --head-dim 64 --intermediate 640 --sliding-window 5 --no-tie --seed 7 --out " +
                          model + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto s = start({"-tp", "3", "-pp", "2", "--max-num-seqs", "4", "--max-num-batched-tokens", "16", "--batch-invariant"},
                 false, model, "4MiB");
  ASSERT_GT(s->pid, 0);
  const std::string log = s->log();
  EXPECT_NE(log.find("local layers: a sliding window of 5 positions in a pool of their own (13 blocks)"),
            std::string::npos) << log;
  httplib::Client c("127.0.0.1", s->port);
  c.set_read_timeout(120, 0);
  auto d = c.Get("/v1/deployment");
  ASSERT_TRUE(d);
  const json dep = json::parse(d->body);
  ASSERT_EQ(dep["ranks"].size(), 6u);
  for (const json& rank : dep["ranks"]) {
    EXPECT_EQ(rank["measured"]["kv_cache"], rank["planned"]["kv_cache"]) << rank.dump();
    EXPECT_EQ(rank["planned"]["kv_cache"], rank["pp_rank"] == 0 ? 159744 : 4194304) << rank.dump();
    EXPECT_EQ(rank["n_kv_blocks"], 998);
  }
  json req = {{"model", "q7"}, {"prompt", json{5, 17, 230, 41, 9}}, {"max_tokens", 60}, {"temperature", 0},
              {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string gen_out = model + ".generate.json";
  const std::string gen = cli_ + " generate " + model + " --prompt-ids 5,17,230,41,9 --max-tokens 60 --json " +
                          "--kv-cache-dtype bf16 --batch-invariant > " + gen_out + " 2>/dev/null";
  ASSERT_EQ(std::system(gen.c_str()), 0);
  std::ifstream gen_in(gen_out);
  const json g = json::parse(std::string(std::istreambuf_iterator<char>(gen_in), {}));
  ASSERT_EQ(g["token_ids"].size(), 60u);
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], g["text"]);
  const std::string metrics = c.Get("/metrics")->body;
  const size_t at = metrics.find("shardlm:kv_local_blocks_in_use_peak{");
  ASSERT_NE(at, std::string::npos) << metrics;
  const int64_t peak = std::stoll(metrics.substr(metrics.find("} ", at) + 2));
  EXPECT_GE(peak, 1);
  EXPECT_LE(peak, 2);  // ceil((5 - 1 + 1) / 16) + 1 while decoding (the prompt's step: 1 block)
  const size_t slid = metrics.find("shardlm:kv_blocks_slid_total{");
  ASSERT_NE(slid, std::string::npos) << metrics;
  EXPECT_GE(std::stoll(metrics.substr(metrics.find("} ", slid) + 2)), 2) << metrics;  // 64 positions: 4 blocks
  EXPECT_EQ(s->stop(), 0) << s->log();
}

TEST_F(ServeLayouts, ALayoutTheRanksCannotRunIsRefusedWithTheReason) {
  auto s = start({"-tp", "29"}, /*expect_exit=*/true);
  EXPECT_LT(s->pid, 0);
  EXPECT_EQ(s->exit_code, 1);
  EXPECT_NE(s->log().find("exceeds the model's 28 attention heads"), std::string::npos) << s->log();
}

// Burst admission (serve --burst-window-ms; engine/arrivals.h). With a
// window of an hour only the requests' own hand-over ends a hold, so each
// request answers within the client's minute only if its handler withdraws
// its announcement once it waits for output: alone, as two prompts in one
// request, streamed, and four at once over two replicas (which share the
// announcements).
TEST_F(ServeLayouts, BurstWindowHoldsNoRequestPastItsHandOver) {
  auto s = start({"-dp", "2", "--burst-window-ms", "3600000"});
  ASSERT_GT(s->pid, 0);
  const json prompt = json{5, 17, 230, 41, 9};
  const std::string alone = complete(s->port, prompt);
  ASSERT_FALSE(alone.rfind("status", 0) == 0 || alone == "no response") << alone;
  httplib::Client c("127.0.0.1", s->port);
  c.set_read_timeout(60, 0);
  json two = {{"model", "q7"}, {"prompt", {prompt, json{300, 2, 2, 77}}}, {"max_tokens", 8}, {"temperature", 0},
              {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", two.dump(), "application/json");
  ASSERT_TRUE(r) << "no answer within a minute";
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"].size(), 2u);
  two["prompt"] = prompt;
  two["stream"] = true;
  r = c.Post("/v1/completions", two.dump(), "application/json");
  ASSERT_TRUE(r) << "no answer within a minute";
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->body.find("data: [DONE]"), std::string::npos) << r->body;
  std::vector<std::string> texts(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) clients.emplace_back([&, i] { texts[i] = complete(s->port, prompt); });
  for (auto& t : clients) t.join();
  for (const auto& t : texts) EXPECT_EQ(t, alone);
  EXPECT_EQ(s->stop(), 0) << s->log();
}

// serve --speculative-config (n-gram): concurrent greedy requests on
// prompts that repeat themselves give the text of serve --batch-invariant
// (the kernels speculation runs on) bit for bit, a stop string and max_tokens
// end them exactly as without, and /metrics shows drafts accepted (so the
// identity is not vacuous). The shutdown log reports the acceptance rate.
// Then the same with a draft model.
TEST_F(ServeLayouts, SpeculativeNgramGivesThePlainTextAndCountsAcceptedDrafts) {
  std::vector<json> requests;
  for (int i = 0; i < 3; ++i) {
    json ids = json::array();
    for (int rep = 0; rep < 3; ++rep)
      for (int k = 0; k < 6 + i; ++k) ids.push_back((k * 41 + i * 89 + 7) % 512);
    requests.push_back({{"model", "q7"}, {"prompt", ids}, {"max_tokens", 24 + 2 * i}, {"temperature", 0},
                        {"ignore_eos", true}});
  }
  // All requests at once, each from its own thread: the engine batches them.
  auto run_all = [&](int port, const std::vector<json>& reqs) {
    std::vector<std::string> out(reqs.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < reqs.size(); ++i)
      threads.emplace_back([&, i] {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60, 0);
        auto r = c.Post("/v1/completions", reqs[i].dump(), "application/json");
        out[i] = !r ? "no response" : r->status != 200 ? "status " + std::to_string(r->status) + ": " + r->body
                                                         : json::parse(r->body)["choices"][0].dump(-1, ' ', false, json::error_handler_t::replace);
      });
    for (auto& t : threads) t.join();
    return out;
  };
  // disable_by_batch_size (vLLM's key) above the 3 requests: drafting stays on.
  const std::string cfg =
      R"({"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4,"prompt_lookup_min":1,"disable_by_batch_size":8})";
  std::vector<std::string> plain, plain_more;
  std::vector<json> more = requests;
  {
    auto s = start({"--batch-invariant"});
    ASSERT_GT(s->pid, 0);
    plain = run_all(s->port, requests);
    for (const auto& p : plain) ASSERT_EQ(p.rfind("{", 0), 0u) << p;
    // Then a stop string from the middle of the first text, and a max_tokens of 5.
    const std::string text0 = json::parse(plain[0])["text"];
    size_t at = 4;  // three ASCII letters past the start (the random model's text is not all ASCII)
    while (at + 3 < text0.size() && !(std::isalpha((unsigned char)text0[at]) && std::isalpha((unsigned char)text0[at + 1]) &&
                                      std::isalpha((unsigned char)text0[at + 2])))
      ++at;
    ASSERT_LT(at + 3, text0.size()) << text0;
    more[0]["stop"] = json::array({text0.substr(at, 3)});
    more[1]["max_tokens"] = 5;
    plain_more = run_all(s->port, more);
    EXPECT_EQ(s->stop(), 0) << s->log();
  }
  auto s = start({"--speculative-config", cfg});
  ASSERT_GT(s->pid, 0);
  EXPECT_EQ(run_all(s->port, requests), plain);
  const std::vector<std::string> spec_more = run_all(s->port, more);
  EXPECT_EQ(spec_more, plain_more);
  EXPECT_EQ(json::parse(spec_more[0])["finish_reason"], "stop") << spec_more[0];
  EXPECT_EQ(json::parse(spec_more[1])["finish_reason"], "length") << spec_more[1];
  httplib::Client c("127.0.0.1", s->port);
  const std::string metrics = c.Get("/metrics")->body;
  auto counter = [&](const std::string& name) {
    const size_t at = metrics.find(name + "{");
    if (at == std::string::npos) return int64_t(-1);
    return int64_t(std::stoll(metrics.substr(metrics.find("} ", at) + 2)));
  };
  EXPECT_GT(counter("vllm:spec_decode_num_drafts_total"), 0) << metrics;
  EXPECT_GT(counter("vllm:spec_decode_num_accepted_tokens_total"), 0) << metrics;
  EXPECT_GE(counter("vllm:spec_decode_num_draft_tokens_total"), counter("vllm:spec_decode_num_accepted_tokens_total"));
  EXPECT_NE(metrics.find("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"q7\",position=\"0\"}"),
            std::string::npos) << metrics;
  // `shardlm bench` reports the run's drafts as the server counted them: its
  // figures equal the /metrics counters' growth over the run (nothing else
  // reaches this server meanwhile).
  {
    const std::string result = dir_ + "/bench_result.json", prompts = dir_ + "/bench_prompts.jsonl";
    std::ofstream(prompts) << R"({"prompt": "ab ab ab ab ab ab ab ab"})" "\n" R"({"prompt": "xyz xyz xyz xyz xyz"})" "\n";
    auto bench = shardlm::testing::run_command(
        cli_ + " bench --base-url http://127.0.0.1:" + std::to_string(s->port) + " --endpoint completions --dataset " +
            prompts + " --num-prompts 3 --output-len 32 --max-concurrency 3 --extra-body '{\"temperature\": 0, "
            "\"ignore_eos\": true}' --save-result " + result,
        /*merge_stderr=*/true);
    ASSERT_EQ(bench.rc, 0) << bench.out;
    EXPECT_NE(bench.out.find("Speculative Decoding"), std::string::npos) << bench.out;
    const std::string after = c.Get("/metrics")->body;
    auto grown = [&](const std::string& name) {
      const size_t at = after.find(name + "{");
      return int64_t(std::stoll(after.substr(after.find("} ", at) + 2))) - counter(name);
    };
    const json r = json::parse(shardlm::testing::read_text_file(result));
    EXPECT_GT(grown("vllm:spec_decode_num_drafts_total"), 0) << after;
    EXPECT_EQ(r["spec_decode_num_drafts"], grown("vllm:spec_decode_num_drafts_total")) << bench.out;
    EXPECT_EQ(r["spec_decode_draft_tokens"], grown("vllm:spec_decode_num_draft_tokens_total")) << bench.out;
    EXPECT_EQ(r["spec_decode_accepted_tokens"], grown("vllm:spec_decode_num_accepted_tokens_total")) << bench.out;
    EXPECT_EQ(r["spec_decode_per_position_acceptance_rates"].size(), 4u) << bench.out;
  }
  EXPECT_EQ(s->stop(), 0) << s->log();
  EXPECT_NE(s->log().find("speculative decoding (ngram):"), std::string::npos) << s->log();

  // A draft model (vLLM's "model" key): the target as its own draft. Its
  // drafts for the three sequences are computed together (catch-up chunks,
  // then one row each per draft step) on the same batch-invariant kernels, so
  // every one is what the target produces: all accepted, and the text is the
  // plain text. A draft computed over the wrong KV blocks or positions would
  // be rejected somewhere.
  const std::string draft_cfg = R"({"model":")" + dir_ + R"(","num_speculative_tokens":3,"disable_by_batch_size":8})";
  auto d = start({"--speculative-config", draft_cfg});
  ASSERT_GT(d->pid, 0);
  EXPECT_EQ(run_all(d->port, requests), plain);
  const std::string dm = httplib::Client("127.0.0.1", d->port).Get("/metrics")->body;
  auto dcounter = [&](const std::string& name) {
    const size_t at = dm.find(name + "{");
    return at == std::string::npos ? int64_t(-1) : int64_t(std::stoll(dm.substr(dm.find("} ", at) + 2)));
  };
  EXPECT_GT(dcounter("vllm:spec_decode_num_draft_tokens_total"), 0) << dm;
  EXPECT_EQ(dcounter("vllm:spec_decode_num_accepted_tokens_total"), dcounter("vllm:spec_decode_num_draft_tokens_total"))
      << dm;
  EXPECT_EQ(d->stop(), 0) << d->log();
  EXPECT_NE(d->log().find("draft model " + dir_ + " beside each replica's driver"), std::string::npos) << d->log();
  EXPECT_NE(d->log().find("speculative decoding (draft model):"), std::string::npos) << d->log();
}

// plan --speculative-config and serve with the same flags: the draft's
// weights, step buffers and KV cache that serve's allocator obtained beside
// the driver (its startup log's "allocated (measured)" line) are the bytes
// plan printed for rank 0, and so is the target's KV pool, which shrinks to
// make room for them. Both size from a share of this machine's RAM
// (--gpu-memory-utilization on the CPU: of physical memory, no reserve), so
// plan is given that memory as the device.
TEST_F(ServeLayouts, DraftModelAllocatesWhatPlanPrints) {
  const std::string draft = dir_ + ".draft";
  ASSERT_EQ(std::system((cli_ + " make-model --like qwen2.5-7b --layers 1 --vocab 512 --hidden 256 --heads 4 "
                                "--kv-heads 2 --intermediate 256 --seed 6 --out " + draft + " > /dev/null")
                            .c_str()),
            0);
  const std::string cfg = R"({"model":")" + draft + R"(","num_speculative_tokens":3})";
  const std::vector<std::string> flags = {"--gpu-memory-utilization", "0.03", "--max-num-seqs", "4",
                                          "--max-num-batched-tokens", "256"};
  const int64_t phys = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  char device[64];
  std::snprintf(device, sizeof device, "1x%lld.%06lldMB", (long long)(phys / 1000000), (long long)(phys % 1000000));
  std::string plan_cmd = cli_ + " plan " + dir_ + " --gpus " + device + " --reserve-gib 0 --json --speculative-config '" +
                         cfg + "'";
  for (const auto& f : flags) plan_cmd += " " + f;
  const std::string plan_out = shardlm::testing::run_command(plan_cmd).out;
  const json plan = json::parse(plan_out, nullptr, false);
  ASSERT_TRUE(plan.is_object()) << plan_cmd << "\n" << plan_out;
  ASSERT_EQ(plan["recommended"]["tp"], 1) << plan_out;
  ASSERT_EQ(plan["recommended"]["dp"], 1) << plan_out;
  const json& rank0 = plan["recommended"]["budgets"][0][0];
  ASSERT_TRUE(rank0["draft"].is_object()) << rank0.dump();

  std::vector<std::string> serve_flags = flags;
  serve_flags.insert(serve_flags.end(), {"--speculative-config", cfg});
  auto s = start(serve_flags, false, dir_, "");
  ASSERT_GT(s->pid, 0);
  EXPECT_FALSE(complete(s->port, json{5, 17, 230, 41, 9}).rfind("status", 0) == 0);
  const std::string log = s->log();
  EXPECT_EQ(s->stop(), 0) << log;
  // The measured figures, each beside plan's verdict on it.
  auto measured = [&](const std::string& what) {
    const size_t line = log.find("draft model " + draft);
    const size_t at = log.find("allocated (measured): weights", line);
    const size_t w = log.find(what + " ", at);
    if (line == std::string::npos || at == std::string::npos || w == std::string::npos) return std::string("missing");
    return log.substr(w + what.size() + 1, log.find(')', w) - w - what.size());
  };
  EXPECT_EQ(measured("weights"), with_commas(rank0["draft"]["weight_bytes"]) + " B (as planned)") << log;
  EXPECT_EQ(measured("workspace"), with_commas(rank0["draft"]["workspace_bytes"]) + " B (as planned)") << log;
  EXPECT_EQ(measured("KV cache").rfind(with_commas(rank0["draft"]["kv_cache_bytes"]) + " B (as planned;", 0), 0u) << log;
  EXPECT_NE(log.find("KV cache holds " + with_commas(rank0["n_kv_tokens"]) + " tokens per replica"), std::string::npos)
      << rank0.dump() << "\n" << log;
  EXPECT_EQ(log.find("DIFFERS from plan"), std::string::npos) << log;
  std::filesystem::remove_all(draft);
}

}  // namespace
