// matmul_bench [--n LIST] [--dtype bf16|f16|f32] [--reps R]: backend::matmul
// per weight shape of a Qwen2.5-0.5B layer (and its lm_head), at each token
// count n, next to the streaming read bandwidth measured in the same run.
//   n = 1:  GB/s of weight bytes streamed (m·k·dtype per call) and the share
//           of the read bandwidth — a batch-1 GEMV should sit near 1.0
//   n > 1:  GFLOP/s (2·n·m·k per call)
// A decode step streams every layer's weights, so a shape's weight is held in
// as many copies as make 512 MiB (more than this VM's 300 MiB L3) and the
// calls cycle through them: each call reads its weight from DRAM, not from a
// cache the previous call warmed. Each shape is warmed up over all copies,
// then timed as the best of R calls (best: on a shared machine, the fastest
// call is the one the fewest other processes interrupted).
// Each row names the kernel path the call took (backend::matmul_path: rows
// with the ISA CPUID chose, packed, amx). Where batch-invariant mode
// (backend::set_batch_invariant) would take another path, the same calls are
// timed in that mode too, interleaved with the default (call by call), and
// the column inv/def gives the ratio of the times: what invariance costs there.
// For bf16 weights on a CPU with AVX512_BF16, the column bf16/def gives the
// same for --dense-activations bf16 (backend/cpu/bf16_dot_gemm.h), timed
// interleaved call by call with the default: below 1.00 it is faster.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/bf16_dot_gemm.h"
#include "core/cpu_isa.h"
#include "backend/cpu/ops.h"
#include "bandwidth.h"

using namespace shardlm;

namespace {

struct Shape {
  const char* name;
  int64_t m, k;  // weight [m, k]
};

const Shape kShapes[] = {
    {"q_proj/o_proj", 896, 896}, {"k_proj/v_proj", 128, 896}, {"gate/up_proj", 4864, 896},
    {"down_proj", 896, 4864},    {"lm_head", 151936, 896},
};

double seconds_best(int reps, const std::function<void()>& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ns = {1, 4, 16, 128};
  DType dtype = DType::kBF16;
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--n") {
      ns.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) ns.push_back(std::stoll(item));
    } else if (a == "--dtype") {
      if (v == "bf16") dtype = DType::kBF16;
      else if (v == "f16") dtype = DType::kF16;
      else if (v == "f32") dtype = DType::kF32;
      else {
        std::fprintf(stderr, "--dtype: expected bf16, f16 or f32, got %s\n", v.c_str());
        return 2;
      }
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(v));
    } else {
      std::fprintf(stderr, "usage: matmul_bench [--n 1,4,16,128] [--dtype bf16|f16|f32] [--reps R]\n");
      return 2;
    }
  }
  const bench::Bandwidth bw = bench::measure_bandwidth();
  std::printf("cpu %s (kernels: %s), threads %d, %s weights; bandwidth: read %.2f GB/s, triad %.2f GB/s\n",
              cpu_model_name().c_str(), cpu_isa_name(active_cpu_isa()),
              omp_get_max_threads(), dtype_safetensors_name(dtype), bw.read / 1e9, bw.triad / 1e9);
  std::printf("%-14s %7s %6s %5s %-12s %10s %9s %9s %8s %8s %9s\n", "shape", "m", "k", "n", "path", "us/call", "GB/s",
              "GFLOP/s", "read%", "inv/def", "bf16/def");
  const backend::DenseActivations def_acts = backend::default_dense_activations();
  const bool bf16_differs = dtype == DType::kBF16 && backend::bf16_dot_gemm_runs() &&
                            def_acts != backend::DenseActivations::kBf16;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const Shape& s : kShapes) {
    const size_t wbytes = static_cast<size_t>(s.m * s.k) * dtype_size(dtype);
    const size_t n_copies = std::max<size_t>(1, (size_t{512} << 20) / wbytes);
    std::vector<uint8_t> w(wbytes * n_copies);
    for (int64_t i = 0; i < s.m * s.k; ++i) store_from_f32(w.data(), dtype, static_cast<size_t>(i), dist(rng));
    for (size_t c = 1; c < n_copies; ++c) std::memcpy(w.data() + c * wbytes, w.data(), wbytes);
    for (int64_t n : ns) {
      if (s.m * n > (int64_t{1} << 24)) continue;  // lm_head at large n: minutes on 2 cores
      std::vector<float> x(static_cast<size_t>(n * s.k)), y(static_cast<size_t>(n * s.m));
      for (float& v : x) v = dist(rng);
      size_t call = 0;
      auto one_call = [&] {
        const backend::MatrixView wv{w.data() + (call++ % n_copies) * wbytes, dtype, s.m, s.k};
        backend::matmul(x.data(), n, wv, nullptr, y.data());
      };
      const backend::MatmulPath path = backend::matmul_path(n, dtype);
      backend::set_batch_invariant(true);
      const bool inv_differs = backend::matmul_path(n, dtype) != path;
      backend::set_batch_invariant(false);
      for (size_t c = 0; c < n_copies; ++c) one_call();  // warm-up: page in every copy
      double t = 1e30, t_inv = 1e30, t_bf16 = 1e30;
      for (int r = 0; r < reps; ++r) {  // interleaved: default, invariant, default, ...
        t = std::min(t, seconds_best(1, one_call));
        if (inv_differs) {
          backend::set_batch_invariant(true);
          t_inv = std::min(t_inv, seconds_best(1, one_call));
          backend::set_batch_invariant(false);
        }
        if (bf16_differs) {
          backend::set_default_dense_activations(backend::DenseActivations::kBf16);
          t_bf16 = std::min(t_bf16, seconds_best(1, one_call));
          backend::set_default_dense_activations(def_acts);
        }
      }
      const double gbs = static_cast<double>(wbytes) / t / 1e9;
      const double gflops = 2.0 * n * s.m * s.k / t / 1e9;
      std::string path_name = backend::matmul_path_name(path);
      if (path == backend::MatmulPath::kRows) path_name += std::string("/") + cpu_isa_name(active_cpu_isa());
      char inv[16] = "-";
      if (inv_differs) std::snprintf(inv, sizeof inv, "%.2f", t_inv / t);
      char bf16[16] = "-";
      if (bf16_differs) std::snprintf(bf16, sizeof bf16, "%.2f", t_bf16 / t);
      std::printf("%-14s %7lld %6lld %5lld %-12s %10.1f %9.2f %9.2f %7.1f%% %8s %9s\n", s.name,
                  static_cast<long long>(s.m), static_cast<long long>(s.k), static_cast<long long>(n),
                  path_name.c_str(), t * 1e6, gbs, gflops, 100.0 * gbs * 1e9 / bw.read, inv, bf16);
    }
  }
  return 0;
}
