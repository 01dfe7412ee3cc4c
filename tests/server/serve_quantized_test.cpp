// `shardlm serve` on quantized checkpoints (make-model's AWQ, GPTQ act-order,
// GPTQ-int8 and FP8 in the published layouts), with uneven tensor and
// pipeline parallelism and the FP8 KV cache: the completion equals
// `shardlm generate`'s greedy text at TP 1, and the start-up log shows every
// rank holding the weight and KV bytes plan predicts (the server compares
// what each rank's backend measured with plan's figures and says "DIFFERS"
// otherwise).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/process.h"

namespace {

using json = nlohmann::json;
using shardlm::testing::env_or;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

struct Case {
  std::string name, make_model_flags, serve_flags;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ServeQuantized : public ::testing::TestWithParam<Case> {};

TEST_P(ServeQuantized, CompletesAsGenerateDoesWithPlansBytesPerRank) {
  const Case c = GetParam();
  const std::string cli = env_or("SHARDLM_CLI", "shardlm");
  const std::string dir = env_or("SHARDLM_BINARY_DIR", "/tmp") + "/tests/server/quant_" + c.name + "." + std::to_string(getpid());
  ASSERT_EQ(std::system((cli + " make-model --like qwen2.5-0.5b --layers 2 --vocab 512 --hidden 768 --heads 6 "
                               "--kv-heads 2 --intermediate 1536 --seed 9 " + c.make_model_flags + " --out " + dir +
                         " > /dev/null").c_str()),
            0);
  const std::string gen = run_capture(cli + " generate " + dir + " --prompt-ids 5,17,230,41,9 --max-tokens 6 " +
                                      "--temperature 0 --json" +
                                      (c.serve_flags.find("fp8") != std::string::npos ? " --kv-cache-dtype fp8" : ""));
  const json g = json::parse(gen.substr(gen.rfind('{')));
  const int port = shardlm::testing::free_loopback_port();
  const std::string log_path = dir + "/serve.log";
  std::vector<std::string> args = {cli, "serve", dir, "--port", std::to_string(port), "--kv-cache-memory", "8MiB",
                                   "--served-model-name", "q"};
  for (size_t b = 0, e; b < c.serve_flags.size(); b = e + 1) {
    e = c.serve_flags.find(' ', b);
    if (e == std::string::npos) e = c.serve_flags.size();
    if (e > b) args.push_back(c.serve_flags.substr(b, e - b));
  }
  pid_t pid = shardlm::testing::spawn_logged(args, log_path);
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(60, 0);
  bool healthy = false;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       std::chrono::steady_clock::now() < deadline;) {
    auto r = client.Get("/health");
    if (r && r->status == 200) {
      healthy = true;
      break;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      pid = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(healthy) << read_file(log_path);
  json req = {{"model", "q"}, {"prompt", json{5, 17, 230, 41, 9}}, {"max_tokens", 6}, {"temperature", 0}};
  auto r = client.Post("/v1/completions", req.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], g["text"]) << c.name;
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string log = read_file(log_path);
  EXPECT_EQ(log.find("DIFFERS from plan"), std::string::npos) << log;
  EXPECT_NE(log.find("(as planned)"), std::string::npos) << log;
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, ServeQuantized,
    ::testing::Values(Case{"awq_tp3", "--quantize awq --group-size 64", "-tp 3"},
                      Case{"gptq_act_tp2_pp2", "--quantize gptq --group-size 64 --desc-act --asym", "-tp 2 -pp 2"},
                      Case{"gptq_int8_tp6", "--quantize gptq-int8 --group-size 64", "-tp 6"},
                      Case{"fp8_tp3_kv_fp8", "--quantize fp8", "-tp 3 --kv-cache-dtype fp8"}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
