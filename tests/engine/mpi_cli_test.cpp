// `mpirun -np N shardlm generate` (ranks as OpenMPI processes) against the
// single-process TP=1 run of the same synthetic checkpoints: greedy tokens
// equal, last-prompt-position logits within 2e-4 of the largest |logit|
// (f32 KV; only the summation order of the TP all-reduces differs), per-rank
// weight bytes equal plan's rank_weight_bytes, a world of the wrong size is
// refused naming both numbers, and a rank that fails stops the whole run
// within seconds naming it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/model_spec.h"
#include "plan/sharding.h"
#include "support/process.h"

namespace {

using Proc = shardlm::testing::CommandResult;
using shardlm::testing::run_command;

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  std::vector<float> v(static_cast<size_t>(in.tellg()) / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

class MpiGenerate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // mpirun refuses root without these; OpenMPI's plugins leak at exit.
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    const char* cli = std::getenv("SHARDLM_CLI");
    const char* build = std::getenv("SHARDLM_BINARY_DIR");
    cli_ = cli ? cli : SHARDLM_CLI_PATH;
    // Outputs: one directory per test process, since ctest runs this suite's
    // tests in parallel. Checkpoints: made once for every test process of one
    // CLI build (make-model of all four takes ~11 s under ASan), in a
    // directory named after the binary's modification time.
    const std::string tests_dir = std::string(build ? build : SHARDLM_BUILD_DIR) + "/tests/engine";
    root_ = tests_dir + "/mpi_cli." + std::to_string(getpid());
    std::filesystem::create_directories(root_);
    struct stat st {};
    ASSERT_EQ(stat(cli_.c_str(), &st), 0) << cli_;
    models_ = tests_dir + "/mpi_cli_models." + std::to_string(st.st_mtim.tv_sec) + "." +
              std::to_string(st.st_mtim.tv_nsec);
    // 28 Q / 4 KV heads (Qwen2.5-7B's), 3 layers; 40 Q / 8 KV heads
    // (Qwen2.5-14B's), 5 layers: PP 2 and 3 split it unevenly. Hidden sizes
    // shrunk (head_dim 16) to keep every run to about a second.
    m7_ = models_ + "/mpi_q7";
    m14_ = models_ + "/mpi_q14";
    make(m7_, "--like qwen2.5-7b --layers 3 --vocab 512 --hidden 448 --intermediate 512 --seed 7");
    make(m14_, "--like qwen2.5-14b --layers 5 --vocab 512 --hidden 640 --intermediate 384 --seed 14");
    // Mixture of experts: Qwen3-30B-A3B's routing (128 experts, top-8) and
    // heads (32 Q / 4 KV); Mixtral's (8 experts, top-2), 3 layers for PP.
    moe_ = models_ + "/mpi_qwen3_moe";
    mixtral_ = models_ + "/mpi_mixtral";
    make(moe_, "--like qwen3-30b-a3b --layers 2 --vocab 512 --hidden 256 --heads 32 --kv-heads 4 --head-dim 32 "
               "--moe-intermediate 64 --seed 3");
    make(mixtral_, "--like mixtral-8x7b --layers 3 --vocab 512 --hidden 256 --heads 32 --kv-heads 8 --head-dim 16 "
                   "--intermediate 128 --seed 5");
    // Gemma 3's shape: layers 0-4 local (window 5), layer 5 global: two KV pools per rank.
    gemma_ = models_ + "/mpi_gemma3";
    make(gemma_, "--like gemma-3-1b --layers 6 --vocab 512 --hidden 320 --heads 4 --kv-heads 1 --head-dim 64 "
                 "--intermediate 640 --sliding-window 5 --no-tie --seed 11");
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }
  // Runs `shardlm <command> --out` into a name of this process's, then renames
  // it into place: a directory that exists is whole, and of two processes that
  // race, the second one's rename fails and it drops its copy.
  static void write_once(const std::string& dir, const std::string& command) {
    if (std::filesystem::exists(dir)) return;
    const std::string mine = dir + ".making." + std::to_string(getpid());
    Proc r = run_command(cli_ + " " + command + " --out " + mine);
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    std::error_code ec;
    std::filesystem::rename(mine, dir, ec);
    if (ec) {
      std::filesystem::remove_all(mine);
      ASSERT_TRUE(std::filesystem::exists(dir)) << "cannot rename " << mine << " to " << dir << ": " << ec.message();
    }
  }
  static void make(const std::string& dir, const std::string& args) { write_once(dir, "make-model " + args); }
  // `shardlm quantize src args` into dir.
  static void quantize(const std::string& dir, const std::string& src, const std::string& args) {
    write_once(dir, "quantize " + src + " " + args);
  }
  static std::string mpirun(int np) {
    return std::string(SHARDLM_MPIRUN_PATH) + " --oversubscribe --allow-run-as-root --mca btl self,vader -np " +
           std::to_string(np) + " ";
  }
  static std::string generate(const std::string& dir, const std::string& tag) {
    return cli_ + " generate " + dir + " --prompt-ids 3,141,59,26,5,35,8 --max-tokens 6 --json --dump-logits " +
           root_ + "/mpi_" + tag + ".logits";
  }

  // TP 2 under mpirun with `flag` given as `driver` on rank 0 and `worker` on
  // rank 1 (each rank its own command line); the driver's logits.
  static std::vector<float> tp2_flag_split(const std::string& dir, const std::string& flag, const std::string& driver,
                                           const std::string& worker, const std::string& tag) {
    Proc r = run_command(mpirun(1) + generate(dir, tag) + " --tp 2 " + flag + " " + driver + " : -np 1 " +
                         generate(dir, tag + "_worker") + " --tp 2 " + flag + " " + worker);
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    return read_f32(root_ + "/mpi_" + tag + ".logits");
  }

  // The mpirun run of tp x pp equals the single-process TP=1 run.
  // env: variables for every rank, e.g. "SHARDLM_COLLECTIVE_WAIT=passive".
  void expect_same_as_tp1(const std::string& dir, int tp, int pp, bool ep = false, const std::string& env = "") {
    const std::string name = std::filesystem::path(dir).filename().string();
    Proc one = run_command(generate(dir, name + "_tp1"));
    ASSERT_EQ(one.rc, 0) << one.out << one.err;
    const auto j1 = nlohmann::json::parse(one.out);
    ASSERT_EQ(j1["token_ids"].size(), 6u);
    const std::string tag = name + "_tp" + std::to_string(tp) + "pp" + std::to_string(pp) + (ep ? "ep" : "");
    const std::string exported = env.empty() ? "" : env + " ";
    const std::string forwarded = env.empty() ? "" : "-x " + env.substr(0, env.find('=')) + " ";
    Proc r = run_command(exported + mpirun(tp * pp) + forwarded + generate(dir, tag) + " --tp " + std::to_string(tp) +
                         " --pp " + std::to_string(pp) +
                         (ep ? " --enable-expert-parallel" : ""));
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    // Only rank 0 prints: exactly one JSON object.
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["token_ids"], j1["token_ids"]) << tag;
    const auto l1 = read_f32(root_ + "/mpi_" + name + "_tp1.logits");
    const auto l = read_f32(root_ + "/mpi_" + tag + ".logits");
    ASSERT_EQ(l1.size(), 512u);
    ASSERT_EQ(l.size(), l1.size()) << tag;
    float scale = 1.0f, worst = 0.0f;
    for (size_t i = 0; i < l.size(); ++i) {
      scale = std::max(scale, std::fabs(l1[i]));
      worst = std::max(worst, std::fabs(l[i] - l1[i]));
    }
    EXPECT_LT(worst / scale, 2e-4f) << tag;
    // rank 0 logs each rank's bytes; they are plan's.
    const shardlm::ModelSpec spec = shardlm::load_model_config(dir + "/config.json");
    shardlm::Layout layout;
    layout.tp = tp;
    layout.pp = pp;
    layout.expert_parallel = ep;
    std::regex line(R"(rank (\d+) \(tp (\d+), pp (\d+)\): weights (\d+) bytes, kv (\d+) bytes)");
    int n_lines = 0;
    for (std::sregex_iterator it(r.err.begin(), r.err.end(), line), end; it != end; ++it, ++n_lines) {
      const int rank = std::stoi((*it)[1]), t = std::stoi((*it)[2]), p = std::stoi((*it)[3]);
      EXPECT_EQ(rank, p * tp + t);
      EXPECT_EQ(std::stoll((*it)[4]), shardlm::rank_weight_bytes(spec, layout, t, p)) << tag << " rank " << rank;
      EXPECT_GT(std::stoll((*it)[5]), 0);
    }
    EXPECT_EQ(n_lines, tp * pp) << r.err;
  }

  static std::string cli_, root_, models_, m7_, m14_, moe_, mixtral_, gemma_;
};
std::string MpiGenerate::cli_, MpiGenerate::root_, MpiGenerate::models_, MpiGenerate::m7_, MpiGenerate::m14_, MpiGenerate::moe_,
    MpiGenerate::mixtral_, MpiGenerate::gemma_;

TEST_F(MpiGenerate, Tp2) { expect_same_as_tp1(m7_, 2, 1); }
TEST_F(MpiGenerate, Tp3) { expect_same_as_tp1(m7_, 3, 1); }
TEST_F(MpiGenerate, Tp6) { expect_same_as_tp1(m7_, 6, 1); }
TEST_F(MpiGenerate, Tp4Heads40) { expect_same_as_tp1(m14_, 4, 1); }
TEST_F(MpiGenerate, Tp5Heads40) { expect_same_as_tp1(m14_, 5, 1); }
TEST_F(MpiGenerate, Pp2Of5Layers) { expect_same_as_tp1(m14_, 1, 2); }
TEST_F(MpiGenerate, Pp3Of5Layers) { expect_same_as_tp1(m14_, 1, 3); }
TEST_F(MpiGenerate, Tp2Pp3) { expect_same_as_tp1(m14_, 2, 3); }
// Collectives and stage hand-offs waited for by polling with sleeps.
TEST_F(MpiGenerate, Tp2Pp2WithPassiveCollectiveWaits) {
  expect_same_as_tp1(m14_, 2, 2, false, "SHARDLM_COLLECTIVE_WAIT=passive");
}
// Experts whole over the processes (128 over 3 = 43, 43, 42; 8 over 4 = 2 each),
// with PP; and without EP, every expert's columns split over 3 processes.
// --dense-activations under mpirun: the driver's choice is broadcast with the
// KV geometry, so a worker started with the other value (MPMD: rank 1 gets
// its own command line) computes what the driver asked for. Its logits equal
// those of the run where every rank was given the driver's value.
TEST_F(MpiGenerate, DenseActivationsFollowTheDriver) {
  if (run_command(cli_ + " generate " + m7_ + " --prompt-ids 3 --max-tokens 1 --dense-activations bf16").rc != 0)
    GTEST_SKIP() << "no AVX512_BF16 here: --dense-activations bf16 is refused";
  auto tp2 = [&](const std::string& driver, const std::string& worker, const std::string& tag) {
    return tp2_flag_split(m7_, "--dense-activations", driver, worker, tag);
  };
  const auto bf16 = tp2("bf16", "bf16", "dense_bf16"), f32 = tp2("f32", "f32", "dense_f32");
  ASSERT_EQ(bf16.size(), 512u);
  EXPECT_NE(bf16, f32);  // the option changes the logits of this bf16 checkpoint
  EXPECT_EQ(tp2("bf16", "f32", "dense_bf16_f32"), bf16);
  EXPECT_EQ(tp2("f32", "bf16", "dense_f32_bf16"), f32);
}

// --quant-activations under mpirun, the same way: an AWQ checkpoint (group
// 64, so each rank's row slices hold whole groups of int8 blocks) whose
// worker is started with the other value computes with the driver's.
TEST_F(MpiGenerate, QuantActivationsFollowTheDriver) {
  const std::string awq = models_ + "/mpi_awq";
  make(awq + "_bf16", "--like qwen2.5-7b --layers 2 --vocab 512 --hidden 512 --heads 8 --kv-heads 4 --head-dim 64 "
                      "--intermediate 512 --seed 9");
  quantize(awq, awq + "_bf16", "--quantize awq --group-size 64");
  auto tp2 = [&](const std::string& driver, const std::string& worker, const std::string& tag) {
    return tp2_flag_split(awq, "--quant-activations", driver, worker, tag);
  };
  const auto int8 = tp2("int8", "int8", "quant_int8"), f32 = tp2("f32", "f32", "quant_f32");
  ASSERT_EQ(int8.size(), 512u);
  if (int8 == f32) GTEST_SKIP() << "no int8-activation kernels in this build or CPU: both values run f32";
  EXPECT_EQ(tp2("int8", "f32", "quant_int8_f32"), int8);
  EXPECT_EQ(tp2("f32", "int8", "quant_f32_int8"), f32);
}

// A draft model under mpirun: it runs whole on rank 0 while the target's
// ranks verify; the target as its own draft has every draft accepted and the
// greedy tokens of the plain single-process run.
TEST_F(MpiGenerate, DraftModelOnRankZeroKeepsTheGreedyTokens) {
  const std::string base = cli_ + " generate " + m14_ + " --prompt-ids 3,141,59,26,5,35,8 --max-tokens 12 --json";
  Proc one = run_command(base + " --batch-invariant");
  ASSERT_EQ(one.rc, 0) << one.out << one.err;
  Proc r = run_command(mpirun(4) + base + " --tp 2 --pp 2 --speculative-config '{\"model\":\"" + m14_ +
                       "\",\"num_speculative_tokens\":3}'");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out), j1 = nlohmann::json::parse(one.out);
  EXPECT_EQ(j["token_ids"], j1["token_ids"]);
  EXPECT_GT(j["speculative"]["num_drafts"].get<int64_t>(), 0) << r.out;
  EXPECT_EQ(j["speculative"]["num_accepted_tokens"], j["speculative"]["num_draft_tokens"]) << r.out;
}
TEST_F(MpiGenerate, Qwen3MoeEp3) { expect_same_as_tp1(moe_, 3, 1, true); }
TEST_F(MpiGenerate, Qwen3MoeEp2Pp2) { expect_same_as_tp1(moe_, 2, 2, true); }
TEST_F(MpiGenerate, Qwen3MoeTp3WithoutEp) { expect_same_as_tp1(moe_, 3, 1); }
TEST_F(MpiGenerate, MixtralEp4) { expect_same_as_tp1(mixtral_, 4, 1, true); }
TEST_F(MpiGenerate, MixtralEp2Pp3) { expect_same_as_tp1(mixtral_, 2, 3, true); }

// -tp auto under mpirun: rank 0 asks plan for the best layout of exactly the
// processes started (one stream: latency, no replicas), every rank runs it,
// and the tokens are TP=1's.
TEST_F(MpiGenerate, TpAutoLaysTheModelOverEveryProcess) {
  Proc one = run_command(generate(m14_, "auto_tp1"));
  ASSERT_EQ(one.rc, 0) << one.err;
  Proc r = run_command(mpirun(3) + generate(m14_, "auto3") + " -tp auto");
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["token_ids"], nlohmann::json::parse(one.out)["token_ids"]);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex("-tp auto: plan chose TP=(\\d+) PP=(\\d+) DP=1 for 3 ")))
      << r.err;
  EXPECT_EQ(std::stoi(m[1]) * std::stoi(m[2]), 3) << r.err;
  // Only rank 0 decided (and logged).
  EXPECT_EQ(r.err.find("plan chose"), r.err.rfind("plan chose")) << r.err;
}

TEST_F(MpiGenerate, WorldOfTheWrongSizeIsRefused) {
  Proc r = run_command(mpirun(3) + generate(m7_, "wrong") + " --tp 2");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("3 processes"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("needs 2"), std::string::npos) << r.err;
}

TEST_F(MpiGenerate, AFailingRankStopsTheRunNamingIt) {
  // Rank 2 throws at load while ranks 0 and 1 wait for it in a collective.
  Proc r = run_command("SHARDLM_TEST_FAIL_RANK=2 " + mpirun(3) + "-x SHARDLM_TEST_FAIL_RANK " + generate(m14_, "dead") +
                   " --pp 3");
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_NE(r.err.find("shardlm: rank 2 failed: rank 2 (tp 0, pp 2, replica 0) failed loading the model"), std::string::npos)
      << r.err;
}

TEST_F(MpiGenerate, AMissingTensorOnlyTheLastStageReadsStopsTheRun) {
  // A copy of the checkpoint whose last layer's down_proj is renamed (same
  // length, so the header stays valid): only PP stage 2 (layer 4) needs it.
  const std::string dir = root_ + "/mpi_q14_broken";
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(m14_))
    std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string(),
                               std::filesystem::copy_options::overwrite_existing);
  const std::string file = dir + "/model.safetensors";
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  const std::string from = "model.layers.4.mlp.down_proj.weight", to = "model.layers.4.mlp.down_proj.weigXX";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), to);
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  Proc r = run_command(mpirun(3) + generate(dir, "broken") + " --pp 3");
  EXPECT_NE(r.rc, 0);
  EXPECT_LT(r.seconds, 20.0);
  EXPECT_NE(r.err.find("shardlm: rank 2 failed: rank 2 (tp 0, pp 2, replica 0) failed loading the model"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("model.layers.4.mlp.down_proj.weight"), std::string::npos) << r.err;
}

// `mpirun -np tp*pp*dp shardlm serve --tp tp --pp pp --dp dp`: every
// replica's driver answers /v1/completions on port + d with the TP=1 greedy
// text; rank 0 logs the router line naming every replica. With pp > 1 four
// requests arrive at once, so micro-batches pipeline through the stages'
// processes.
// tp_auto: `-tp auto` instead of the degrees, over tp × pp × dp processes;
// the replicas to query are those plan chose (read from the log).
void serve_matches_tp1(const std::string& cli, const std::string& root, const std::string& dir, int tp, int dp,
                       int pp = 1, bool tp_auto = false) {
  const std::string prompt = "3,141,59,26,5,35,8";
  Proc one = run_command(cli + " generate " + dir + " --prompt-ids " + prompt + " --max-tokens 6 --json");
  ASSERT_EQ(one.rc, 0) << one.out << one.err;
  const auto want = nlohmann::json::parse(one.out);
  const int port = shardlm::testing::free_loopback_ports(std::max(dp, 1) * (tp_auto ? tp * pp : 1));  // port + d per replica
  const std::string name = "tp" + std::to_string(tp) + "pp" + std::to_string(pp) + "dp" + std::to_string(dp);
  const std::string log = root + "/mpi_serve_" + name + ".log";
  const std::string cmd = std::string(SHARDLM_MPIRUN_PATH) +
                          " --oversubscribe --allow-run-as-root --mca btl self,vader -np " +
                          std::to_string(tp * pp * dp) + " " + cli + " serve " + dir +
                          (tp_auto ? std::string(" -tp auto")
                                   : " --tp " + std::to_string(tp) + " --pp " + std::to_string(pp) + " --dp " +
                                         std::to_string(dp)) +
                          " --host 127.0.0.1 --port " + std::to_string(port) + " --kv-cache-memory 8MiB";
  Proc started = run_command("sh -c '" + cmd + " >" + log + " 2>&1 & echo $!'");
  const int pid = std::stoi(started.out);
  // A failed ASSERT returns early: stop the job anyway, or its processes
  // would load the machine for every test after this one.
  struct StopOnEarlyReturn {
    int pid;
    ~StopOnEarlyReturn() {
      if (pid > 0) kill(pid, SIGTERM);
    }
  } guard{pid};
  auto log_text = [&] {
    std::ifstream in(log);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  if (tp_auto) {
    const int n = tp * pp * dp;
    std::smatch m;
    std::string text;
    for (int i = 0; i < 900; ++i) {
      text = log_text();
      if (std::regex_search(text, m, std::regex("-tp auto: plan chose TP=(\\d+) PP=(\\d+) DP=(\\d+)"))) break;
      usleep(100000);
    }
    ASSERT_FALSE(m.empty()) << text;
    tp = std::stoi(m[1]);
    pp = std::stoi(m[2]);
    dp = std::stoi(m[3]);
    EXPECT_EQ(tp * pp * dp, n) << text;
  }
  for (int d = 0; d < dp; ++d) {
    const std::string base = "http://127.0.0.1:" + std::to_string(port + d);
    bool ready = false;
    for (int i = 0; i < 900 && !ready; ++i) {  // 90 s: loading under a sanitizer on a busy machine
      Proc h = run_command("curl -s -o /dev/null -w '%{http_code}' " + base + "/health");
      ready = h.out == "200";
      if (!ready && kill(pid, 0) != 0) break;  // mpirun is gone: it will never answer
      if (!ready) usleep(100000);
    }
    ASSERT_TRUE(ready) << "replica " << d << " did not become ready:\n" << log_text();
    const std::string body = R"({"model":")" + dir + R"(","prompt":[)" + prompt +
                             R"(],"max_tokens":6,"temperature":0})";
    const int n_concurrent = pp > 1 ? 4 : 1;
    const std::string out = root + "/mpi_serve_" + name + "_r" + std::to_string(d) + "_";
    std::string script;
    for (int k = 0; k < n_concurrent; ++k)
      script += "curl -s " + base + "/v1/completions -H 'Content-Type: application/json' -d '" + body + "' >" + out +
                std::to_string(k) + " & ";
    {
      std::ofstream sh(out + "requests.sh");
      sh << script << "wait\n";
    }
    Proc c = run_command("sh " + out + "requests.sh");
    ASSERT_EQ(c.rc, 0) << c.err;
    for (int k = 0; k < n_concurrent; ++k) {
      std::ifstream in(out + std::to_string(k));
      std::stringstream ss;
      ss << in.rdbuf();
      const auto j = nlohmann::json::parse(ss.str(), nullptr, false);
      ASSERT_TRUE(j.is_object() && j.contains("choices")) << ss.str();
      EXPECT_EQ(j["choices"][0]["text"], want["text"]) << "replica " << d << ": " << ss.str();
      EXPECT_EQ(j["usage"]["completion_tokens"], want["token_ids"].size()) << ss.str();
    }
    if (pp > 1) {
      // The requests were split over micro-batches that overlapped in the pipeline.
      Proc m = run_command("curl -s " + base + "/metrics");
      std::smatch hit;
      ASSERT_TRUE(std::regex_search(m.out, hit, std::regex("shardlm:pipeline_overlapped_batches_total\\S* ([0-9.e+]+)")))
          << m.out;
      EXPECT_GT(std::stod(hit[1]), 0.0) << m.out;
    }
  }
  guard.pid = -1;
  kill(pid, SIGTERM);
  // mpirun is not our child (sh started it): poll until it is gone.
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pid_s, comm, state;
    stat >> pid_s >> comm >> state;
    gone = kill(pid, 0) != 0 || state == "Z";  // a zombie nobody reaps has exited too
    if (!gone) usleep(100000);
  }
  if (!gone) {
    // What is still alive, and where each of its threads waits, with the
    // job's log: a stuck shutdown names the process and the call it sits in.
    Proc tree = run_command("ps -eo pid,ppid,stat,wchan:32,etime,args --forest | grep -v ' grep ' | grep -A8 -- '" +
                            std::to_string(pid) + "'");
    Proc stacks = run_command(
        "for p in $(pgrep -f -- '" + cli + " serve'); do echo \"== $p\"; "
        "gdb -p $p -batch -ex 'thread apply all bt 8' 2>/dev/null | grep -E '^(Thread|#)' | head -80; done");
    ADD_FAILURE() << "mpirun still running 30 s after SIGTERM\n" << tree.out << "\n" << stacks.out << "\nlog:\n"
                  << log_text();
    kill(pid, SIGKILL);
  }
  const std::string text = log_text();
  std::string router = "shardlm router";
  for (int d = 0; d < dp; ++d) router += " --backend http://127.0.0.1:" + std::to_string(port + d);
  EXPECT_NE(text.find(router), std::string::npos) << text;
  // rank 0's load report: every rank of the replica holds what plan predicted.
  EXPECT_NE(text.find("(as planned)"), std::string::npos) << text;
  EXPECT_EQ(text.find("DIFFERS from plan"), std::string::npos) << text;
}

TEST_F(MpiGenerate, ServeTp2AnswersWithTheTp1Tokens) { serve_matches_tp1(cli_, root_, m7_, 2, 1); }
TEST_F(MpiGenerate, ServeTp2Dp2ReplicasOnTwoPorts) { serve_matches_tp1(cli_, root_, m7_, 2, 2); }
TEST_F(MpiGenerate, ServePp2PipelinesConcurrentRequests) { serve_matches_tp1(cli_, root_, m14_, 1, 1, 2); }
// Gemma 3 over mpirun: the driver's executor passes the local layers' pool to
// every process (the KV geometry broadcast), so each rank's measured KV, two
// pools (stage 0 holds only local layers), is what plan predicted ("as
// planned"; a process without the local pool would allocate the global pool
// for every layer), and the text is generate's.
TEST_F(MpiGenerate, ServeGemma3Tp2Pp2TwoKvPoolsAsPlanned) { serve_matches_tp1(cli_, root_, gemma_, 2, 1, 2); }
TEST_F(MpiGenerate, ServeTpAutoOverFourProcesses) { serve_matches_tp1(cli_, root_, m7_, 4, 1, 1, true); }

}  // namespace
