// --device for the commands that run the model (generate, perplexity, serve):
// cpu, cuda or cuda:N (backend/device/device_choice.h has the rule), and the
// KV-cache dtype each device defaults to.
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace CLI {
class App;
}

namespace shardlm::cli {

// Adds --device (default cpu) to a subcommand.
void add_device_option(CLI::App* sub, std::string* value);
// Adds --cuda-graphs on|off (default: on for a GPU, off on the CPU;
// backend::parse_cuda_graphs_flag reads it once the device is known).
void add_cuda_graphs_option(CLI::App* sub, std::string* value);

// The device of ranks that run as threads of this process (all on one GPU,
// sharing it). Throws what device_for_rank throws (no GPU, index past them).
Device device_for_thread_ranks(const std::string& flag, int n_ranks);

// The device of this process under mpirun (one GPU per process: local rank %
// GPUs), from OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE.
Device device_for_mpi_process(const std::string& flag);

// Adds --quant-activations int8|f32: how AWQ/GPTQ matmuls take the
// activations (backend/cpu/quant_ops.h). Default: SHARDLM_QUANT_ACTIVATIONS, else int8.
void add_quant_activations_option(CLI::App* sub, std::string* value);
// Sets the process's choice from the flag, or checks the environment variable
// when the flag is empty, so that a bad value stops the command before any
// model is loaded. Throws Error(kInvalidArgument) naming the flag or variable.
void apply_quant_activations(const std::string& flag);

// Adds --dense-activations f32|bf16: how matmuls on bf16 weights take the
// activations on the CPU (backend/ops.h DenseActivations). Default:
// SHARDLM_DENSE_ACTIVATIONS, else f32 (exact).
void add_dense_activations_option(CLI::App* sub, std::string* value);
// Sets the process's choice from the flag, or checks the environment variable
// when the flag is empty, before any model is loaded. Throws
// Error(kInvalidArgument) naming the flag or variable for a bad value, and
// Error(kUnsupported) for bf16 where the CPU lacks AVX512_BF16 (or
// SHARDLM_ISA caps it) or with a --device other than cpu.
void apply_dense_activations(const std::string& flag, const std::string& device_flag);

// --kv-cache-dtype when the user gave none: f32 on the CPU (exact), bf16 on a
// GPU (the only cache dtype its kernels have).
DType default_kv_dtype(const Device& device);

}  // namespace shardlm::cli
