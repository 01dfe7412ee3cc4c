// matmul_group_bench [--n LIST] [--dtype bf16|f16|f32] [--reps R]: the
// matmuls of a Qwen2.5-0.5B layer that read the same x, run one call per
// matrix (backend::matmul, as before issue 28) and grouped
// (backend::matmul_many: one parallel region over every matrix's row
// blocks), interleaved call by call in this process, at each token count n:
//   q/k/v    896×896 + 128×896 + 128×896  (2.0 MB of bf16)
//   gate/up  4864×896 twice               (17.4 MB of bf16)
// Columns: the median and best microseconds per group of calls each way,
// grouped/separate of the medians (below 1.00 the grouping is faster), and
// at every n the weight bytes streamed per second as a share of the read
// bandwidth measured in the same run (at n = 1 a GEMV should sit near 1.0).
// As matmul_bench: the weights are held in as many copies as make 512 MiB
// and the calls cycle through them, so each reads its weights from DRAM.
// Never fails on timing: it prints what it measured.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cpu_isa.h"
#include "backend/cpu/ops.h"
#include "bandwidth.h"

using namespace shardlm;

namespace {

struct Group {
  const char* name;
  std::vector<int64_t> ms;  // each matrix [m, k]
  int64_t k;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ns = {1, 4, 16};
  DType dtype = DType::kBF16;
  int reps = 40;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i], v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--n" && !v.empty()) {
      ns.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) ns.push_back(std::stoll(item));
    } else if (a == "--dtype" && (v == "bf16" || v == "f16" || v == "f32")) {
      dtype = v == "bf16" ? DType::kBF16 : v == "f16" ? DType::kF16 : DType::kF32;
    } else if (a == "--reps" && !v.empty()) {
      reps = std::max(1, std::stoi(v));
    } else {
      std::fprintf(stderr, "usage: matmul_group_bench [--n 1,4,16] [--dtype bf16|f16|f32] [--reps R]\n");
      return 2;
    }
  }
  const bench::Bandwidth bw = bench::measure_bandwidth();
  std::printf("cpu %s (kernels: %s), threads %d, %s weights; bandwidth: read %.2f GB/s\n",
              cpu_model_name().c_str(), cpu_isa_name(active_cpu_isa()),
              omp_get_max_threads(), dtype_safetensors_name(dtype), bw.read / 1e9);
  std::printf("%-8s %4s %-6s %10s %10s %10s %10s %8s %7s %7s\n", "group", "n", "path", "sep_med", "grp_med",
              "sep_best", "grp_best", "grp/sep", "sep%", "grp%");
  const Group groups[] = {{"q/k/v", {896, 128, 128}, 896}, {"gate/up", {4864, 4864}, 896}};
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const Group& g : groups) {
    const int64_t k = g.k, n_parts = static_cast<int64_t>(g.ms.size());
    std::vector<size_t> offset;  // of each matrix within one copy
    size_t copy_bytes = 0;
    for (int64_t m : g.ms) {
      offset.push_back(copy_bytes);
      copy_bytes += static_cast<size_t>(m * k) * dtype_size(dtype);
    }
    const size_t n_copies = std::max<size_t>(1, (size_t{512} << 20) / copy_bytes);
    std::vector<uint8_t> w(copy_bytes * n_copies);
    for (size_t i = 0; i < copy_bytes / dtype_size(dtype); ++i) store_from_f32(w.data(), dtype, i, dist(rng));
    for (size_t c = 1; c < n_copies; ++c) std::memcpy(w.data() + c * copy_bytes, w.data(), copy_bytes);
    for (int64_t n : ns) {
      std::vector<float> x(static_cast<size_t>(n * k));
      for (float& v : x) v = dist(rng);
      std::vector<std::vector<float>> y;
      for (int64_t m : g.ms) y.emplace_back(static_cast<size_t>(n * m));
      size_t call = 0;
      std::vector<std::vector<backend::MatmulPart>> copies(n_copies);  // [copy][part]
      for (size_t c = 0; c < n_copies; ++c)
        for (int64_t p = 0; p < n_parts; ++p)
          copies[c].push_back({backend::MatrixView{w.data() + c * copy_bytes + offset[p], dtype, g.ms[p], k}, nullptr,
                               y[p].data()});
      auto separate = [&] {
        for (const backend::MatmulPart& p : copies[call++ % n_copies]) backend::matmul(x.data(), n, p.w, nullptr, p.y);
      };
      auto grouped = [&] { backend::matmul_many(x.data(), n, copies[call++ % n_copies].data(), n_parts); };
      auto seconds = [](const auto& f) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      for (size_t c = 0; c < n_copies; ++c) separate();  // warm-up: page in every copy
      std::vector<double> t_sep, t_grp;
      for (int r = 0; r < reps; ++r) {  // interleaved: separate, grouped, separate, ...
        t_sep.push_back(seconds(separate));
        t_grp.push_back(seconds(grouped));
      }
      const double sep = median(t_sep), grp = median(t_grp);
      const double read_sep = static_cast<double>(copy_bytes) / sep / bw.read;
      const double read_grp = static_cast<double>(copy_bytes) / grp / bw.read;
      std::printf("%-8s %4lld %-6s %10.1f %10.1f %10.1f %10.1f %8.2f %6.1f%% %6.1f%%\n", g.name,
                  static_cast<long long>(n), backend::matmul_path_name(backend::matmul_path(n, dtype)), sep * 1e6,
                  grp * 1e6, *std::min_element(t_sep.begin(), t_sep.end()) * 1e6,
                  *std::min_element(t_grp.begin(), t_grp.end()) * 1e6, grp / sep, 100.0 * read_sep,
                  100.0 * read_grp);
    }
  }
  return 0;
}
