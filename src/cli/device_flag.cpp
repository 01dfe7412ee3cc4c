#include "cli/device_flag.h"

#include <CLI/CLI.hpp>

#include <cstdlib>

#include "backend/backend.h"
#include "backend/cpu/bf16_dot_gemm.h"
#include "backend/device/device_choice.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_ops.h"
#include "core/error.h"

namespace shardlm::cli {

void add_device_option(CLI::App* sub, std::string* value) {
  sub->add_option("--device", *value,
                  "cpu, cuda or cuda:N. Under mpirun, cuda gives each process GPU (local rank % GPUs); without "
                  "mpirun every rank (thread) shares one GPU (needs a build with -DSHARDLM_CUDA=ON)")
      ->capture_default_str();
}

void add_cuda_graphs_option(CLI::App* sub, std::string* value) {
  sub->add_option("--cuda-graphs", *value,
                  "on or off: decode steps replayed from CUDA graphs captured per batch-size bucket (default on "
                  "with --device cuda at TP = PP = 1; refused on the CPU, which has no graphs)")
      ->check(CLI::IsMember({"on", "off"}));
}

void add_quant_activations_option(CLI::App* sub, std::string* value) {
  sub->add_option("--quant-activations", *value,
                  "int8 or f32: AWQ/GPTQ matmuls quantize the activations to int8 per 32 inputs and use VNNI dot "
                  "products (int8, the default), or dequantize the weights to f32 in registers (f32: exact, slower). "
                  "Default: the SHARDLM_QUANT_ACTIVATIONS environment variable, else int8");
}

void apply_quant_activations(const std::string& flag) {
  if (flag.empty()) {
    backend::default_quant_activations();  // throws for a bad SHARDLM_QUANT_ACTIVATIONS
    return;
  }
  if (flag != "int8" && flag != "f32")
    fail(ErrorCode::kInvalidArgument, "--quant-activations '", flag,
         "': use int8 (int8 activations with VNNI dot products, the default) or f32 (weights dequantized to f32)");
  backend::set_default_quant_activations(flag == "int8" ? backend::QuantActivations::kInt8
                                                        : backend::QuantActivations::kF32);
}

void add_dense_activations_option(CLI::App* sub, std::string* value) {
  sub->add_option("--dense-activations", *value,
                  "f32 or bf16: matmuls on bf16 weights take the activations as f32 (exact, the default) or rounded "
                  "to bf16 once per matmul with AVX512_BF16 dot products (bf16: faster prefill, not exact; refused "
                  "where the CPU lacks AVX512_BF16). Default: the SHARDLM_DENSE_ACTIVATIONS environment variable, "
                  "else f32");
}

void apply_dense_activations(const std::string& flag, const std::string& device_flag) {
  backend::DenseActivations a = backend::DenseActivations::kF32;
  const char* source = "--dense-activations bf16";
  if (flag.empty()) {
    a = backend::default_dense_activations();  // throws for a bad or unrunnable SHARDLM_DENSE_ACTIVATIONS
    source = "SHARDLM_DENSE_ACTIVATIONS=bf16";
  } else {
    if (!backend::parse_dense_activations(flag.c_str(), &a))
      fail(ErrorCode::kInvalidArgument, "--dense-activations '", flag,
           "': use f32 (exact, the default) or bf16 (bf16 weights take bf16-rounded activations and AVX512_BF16 dot "
           "products)");
    if (a == backend::DenseActivations::kBf16 && !backend::bf16_dot_gemm_runs())
      fail(ErrorCode::kUnsupported, "--dense-activations bf16: ", backend::bf16_dot_gemm_missing(),
           "; drop the flag or use f32");
    backend::set_default_dense_activations(a);
  }
  if (a == backend::DenseActivations::kBf16 && !backend::parse_device_flag(device_flag).device.is_cpu())
    fail(ErrorCode::kUnsupported, source, ": a CPU kernel option, and --device is ", device_flag,
         "; drop it or run on --device cpu");
}

Device device_for_thread_ranks(const std::string& flag, int n_ranks) {
  const backend::DeviceFlag f = backend::parse_device_flag(flag);
  if (f.device.is_cpu()) return f.device;
  backend::require_device_support(f.device);
  return backend::device_for_rank({f, /*ranks_are_processes=*/false, 0, n_ranks, backend::cuda_device_count()});
}

Device device_for_mpi_process(const std::string& flag) {
  const backend::DeviceFlag f = backend::parse_device_flag(flag);
  if (f.device.is_cpu()) return f.device;
  backend::require_device_support(f.device);
  auto env_int = [](const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v ? std::atoi(v) : fallback;
  };
  return backend::device_for_rank({f, /*ranks_are_processes=*/true, env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0),
                                   env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1), backend::cuda_device_count()});
}

DType default_kv_dtype(const Device& device) { return device.is_cpu() ? DType::kF32 : DType::kBF16; }

}  // namespace shardlm::cli
