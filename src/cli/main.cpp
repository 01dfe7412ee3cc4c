#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "cli/command.h"
#include "core/error.h"

namespace shardlm::cli {

std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> registry;
  return registry;
}

namespace {
int g_exit_code = 0;
}

void set_command_action(CLI::App* sub, std::function<int()> action) {
  sub->callback([action = std::move(action)] { g_exit_code = action(); });
}

}  // namespace shardlm::cli

namespace {

// vLLM spells its parallelism flags -tp/-pp/-dp; CLI11 short options are one
// letter, so those spellings become the long names before parsing.
std::vector<std::string> rewrite_vllm_short_flags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args) {
    for (const auto& [short_name, long_name] : {std::pair<std::string, std::string>{"-tp", "--tensor-parallel-size"},
                                                {"-pp", "--pipeline-parallel-size"},
                                                {"-dp", "--data-parallel-size"}}) {
      if (a == short_name) a = long_name;
      else if (a.rfind(short_name + "=", 0) == 0) a = long_name + a.substr(short_name.size());
    }
  }
  return args;
}

// The subcommands whose work runs OpenMP teams (model forward passes,
// kernels); the first argument names the subcommand.
bool runs_model_kernels(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string command = argv[1];
  for (const char* name : {"serve", "generate", "perplexity", "quantize", "doctor"})
    if (command == name) return true;
  return false;
}

// libgomp's spin before a worker sleeps (see main).
constexpr const char* kDefaultSpinCount = "10000";

}  // namespace

int main(int argc, char** argv) {
  // libgomp reads its wait settings when it loads, before main: to default
  // them, set them and start again. A worker that finishes an op spins up to
  // GOMP_SPINCOUNT iterations (~10-100 µs) for the next op of the step before
  // it sleeps in the kernel. A decode step runs ~10 ops per layer back to back,
  // so waking sleeping workers for each (OMP_WAIT_POLICY=passive, this
  // default until stop 40) cost 1.33× at batch 1 on Qwen2.5-0.5B and 9.7× on
  // the 8.9 M demo model (README, Performance); spinning without end
  // (OMP_WAIT_POLICY=active) stalls rank threads and HTTP threads that share
  // few cores for seconds, and libgomp cuts the spin to 1,000 itself when its
  // threads outnumber the cores. Either variable in the environment wins.
  // Only the commands that run a model's kernels start again: a second start
  // costs a whole process start-up (a second under ASan), which bench,
  // router, plan, verify and the rest need not pay. (A .preinit_array setenv
  // cannot do it: libc resets environ from the original block after preinit
  // functions.)
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr &&
      runs_model_kernels(argc, argv)) {
    setenv("GOMP_SPINCOUNT", kDefaultSpinCount, 1);
    execv("/proc/self/exe", argv);  // returns only on failure: carry on as we are
  }
  std::vector<std::string> args = rewrite_vllm_short_flags(argc, argv);
  std::vector<char*> arg_ptrs;
  for (auto& a : args) arg_ptrs.push_back(a.data());
  argv = arg_ptrs.data();
  CLI::App app{"shardlm: serve large language models across any number of devices"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(SHARDLM_VERSION));
  for (auto setup : shardlm::cli::command_registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const shardlm::Error& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return shardlm::cli::g_exit_code;
}
