// `shardlm doctor`: what people otherwise collect by hand before filing a GPU
// serving problem: devices, memory, driver/CUDA/NCCL versions, the peer-access
// matrix, NUMA affinity, the NCCL_* variables in effect, and what the usual
// NCCL remedies cost. Without a GPU, or in a build without CUDA, it says so
// and exits 0 (nothing is wrong with the machine for CPU serving).
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>

#include "backend/device/gpu_report.h"
#include "cli/command.h"
#if SHARDLM_HAVE_CUDA
#include "backend/cuda/device_probe.h"
#endif

extern char** environ;

namespace shardlm::cli {

namespace {

int run_doctor() {
  backend::GpuReport report;
#if SHARDLM_HAVE_CUDA
  report = backend::cuda::probe_gpus();
#endif
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  std::ifstream version_file("/proc/version");
  const std::string proc_version((std::istreambuf_iterator<char>(version_file)), std::istreambuf_iterator<char>());
  std::cout << backend::format_gpu_report(report, backend::nccl_environment(env), backend::is_wsl(proc_version));
  return 0;
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("doctor", "Report GPUs, drivers, CUDA/NCCL versions, peer access and NCCL settings");
  set_command_action(sub, [] { return run_doctor(); });
}

}  // namespace

SHARDLM_REGISTER_COMMAND(setup);

}  // namespace shardlm::cli
