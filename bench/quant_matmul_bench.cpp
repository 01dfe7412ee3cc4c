// quant_matmul_bench [--n 1,8] [--reps R]: the quantized kernels against
// shardlm's own BF16 matmul on the Linears of one Qwen2.5-7B decoder layer
// (q/k/v/o, gate/up, down: hidden 3584, intermediate 18944), at each token
// count n (1: a decode step; 8: eight sequences decoding together). Formats:
// bf16 (backend::matmul), AWQ and GPTQ 4-bit (group 128), GPTQ 8-bit (group
// 128), each with int8 and with f32 activations, and FP8 (blocks 128x128);
// then AWQ and GPTQ on the AVX2 kernels (what an AVX2-only CPU runs, before
// them the scalar reference), called directly beside the path this CPU takes.
// Each weight is held in as many copies as make 512 MiB (more than this VM's
// 300 MiB L3), so every call reads its weight from DRAM. The formats are
// timed interleaved (one call of each per round, R rounds) and each keeps
// its best call: on a shared machine all formats see the same load, and the
// best call is the one the fewest other processes interrupted. Beside the
// wall time, each call's process CPU time (CLOCK_PROCESS_CPUTIME_ID): time
// another process held the core is not counted, so under heavy load run
// with OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive and read the CPU columns
// (one core's throughput; memory stalls still count).
//   per shape: us/call per format; then the layer (7 Linears) per format:
//   wall us, CPU us, weight MB read, x of bf16's speed (wall and CPU).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/cpu_isa.h"
#include "backend/cpu/quant_ops.h"
#include "backend/cpu/quant_ops_isa.h"
#include "loader/quant_config.h"
#include "loader/quant_pack.h"

using namespace shardlm;

namespace {

struct Shape {
  const char* name;
  int64_t m, k;   // weight [m, k]
  int per_layer;  // how many such Linears a layer has
};

const Shape kShapes[] = {{"q/o_proj", 3584, 3584, 2},
                         {"k/v_proj", 512, 3584, 2},
                         {"gate/up_proj", 18944, 3584, 2},
                         {"down_proj", 3584, 18944, 1}};

// One stored format of one shape, with its copies.
struct Stored {
  std::string format;  // bf16, awq, gptq, gptq-int8, fp8
  size_t bytes = 0;    // of one copy
  std::vector<std::map<QuantPart, std::vector<uint8_t>>> copies;  // quantized parts per copy
  std::vector<std::vector<uint8_t>> dense;                        // bf16 copies
  QuantConfig cfg;
};

Stored make_stored(const std::string& format, const Shape& s, const std::vector<float>& w) {
  Stored st;
  st.format = format;
  const int64_t N = s.m, K = s.k;
  std::vector<uint8_t> one;
  std::map<QuantPart, std::vector<uint8_t>> parts;
  if (format == "bf16") {
    one.resize(static_cast<size_t>(N * K) * 2);
    for (int64_t i = 0; i < N * K; ++i) store_from_f32(one.data(), DType::kBF16, static_cast<size_t>(i), w[i]);
    st.bytes = one.size();
  } else {
    st.cfg = published_quant_config(format, 128, false, true, "bench");
    const int64_t pf = st.cfg.pack_factor(), G = st.cfg.n_groups(K);
    std::vector<TensorSpec> specs;
    auto part = [&](QuantPart qp, std::vector<int64_t> shape, DType d) {
      TensorSpec t{std::string("m.") + quant_part_name(qp), shape};
      t.part = qp;
      t.dtypes = {d};
      specs.push_back(t);
    };
    switch (st.cfg.method) {
      case QuantMethod::kAwq:
        part(QuantPart::kQWeight, {K, N / pf}, DType::kI32);
        part(QuantPart::kQZeros, {G, N / pf}, DType::kI32);
        part(QuantPart::kScales, {G, N}, DType::kF16);
        break;
      case QuantMethod::kGptq:
        part(QuantPart::kQWeight, {K / pf, N}, DType::kI32);
        part(QuantPart::kQZeros, {G, N / pf}, DType::kI32);
        part(QuantPart::kScales, {G, N}, DType::kF16);
        part(QuantPart::kGIdx, {K}, DType::kI32);
        break;
      default:
        part(QuantPart::kFp8Weight, {N, K}, DType::kF8E4M3);
        part(QuantPart::kScaleInv, {(N + 127) / 128, (K + 127) / 128}, DType::kBF16);
    }
    parts = quantize_linear(st.cfg, w.data(), N, K, specs);
    for (const auto& [qp, b] : parts)
      if (qp != QuantPart::kGIdx) st.bytes += b.size();
  }
  const size_t n_copies = std::max<size_t>(1, (size_t{512} << 20) / st.bytes);
  for (size_t c = 0; c < n_copies; ++c) {
    if (format == "bf16") st.dense.push_back(one);
    else st.copies.push_back(parts);
  }
  return st;
}

backend::QuantMatrixView view_of(const Stored& st, size_t copy, const Shape& s) {
  const auto& p = st.copies[copy];
  backend::QuantMatrixView v;
  v.n_out = s.m;
  v.n_in = s.k;
  v.bits = st.cfg.bits;
  auto i32 = [&](QuantPart qp) { return reinterpret_cast<const int32_t*>(p.at(qp).data()); };
  if (st.cfg.method == QuantMethod::kFp8) {
    v.scheme = backend::WeightScheme::kFp8;
    v.bits = 8;
    v.weight = p.at(QuantPart::kFp8Weight).data();
    v.scales = p.at(QuantPart::kScaleInv).data();
    v.scales_dtype = DType::kBF16;
    v.n_groups = (s.m + 127) / 128;
    v.scale_cols = (s.k + 127) / 128;
    v.block_n = v.block_k = 128;
    return v;
  }
  v.scheme = st.cfg.method == QuantMethod::kAwq ? backend::WeightScheme::kAwq : backend::WeightScheme::kGptq;
  v.group_size = st.cfg.group_rows(s.k);
  v.zero_offset = st.cfg.method == QuantMethod::kGptq ? st.cfg.zero_offset : 0;
  v.qweight = i32(QuantPart::kQWeight);
  v.qzeros = i32(QuantPart::kQZeros);
  v.scales = p.at(QuantPart::kScales).data();
  v.scales_dtype = DType::kF16;
  v.n_groups = st.cfg.n_groups(s.k);
  if (v.scheme == backend::WeightScheme::kGptq) v.g_idx = i32(QuantPart::kGIdx);
  return v;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// A row of the table: a stored format and how its activations are taken.
struct Variant {
  std::string label;
  int stored;  // index into the shape's stored formats
  backend::QuantActivations acts = backend::QuantActivations::kF32;
  bool avx2 = false;  // quant_avx2::quant_matmul, whatever path quant_matmul takes here
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ns = {1, 8};
  int reps = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--n") {
      ns.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) ns.push_back(std::stoll(item));
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(v));
    } else {
      std::fprintf(stderr, "usage: quant_matmul_bench [--n 1,8] [--reps R]\n");
      return 2;
    }
  }
  const std::vector<std::string> formats = {"bf16", "awq", "gptq", "gptq-int8", "fp8"};
  using backend::QuantActivations;
  std::vector<Variant> variants = {
      {"bf16", 0},
      {"awq int8-x", 1, QuantActivations::kInt8},      {"awq f32-x", 1, QuantActivations::kF32},
      {"gptq4 int8-x", 2, QuantActivations::kInt8},    {"gptq4 f32-x", 2, QuantActivations::kF32},
      {"gptq8 int8-x", 3, QuantActivations::kInt8},    {"gptq8 f32-x", 3, QuantActivations::kF32},
      {"fp8", 4, QuantActivations::kF32}};
  if (detected_cpu_isa() >= CpuIsa::kAvx2)
    for (auto [label, stored] : {std::pair{"awq avx2", 1}, std::pair{"gptq4 avx2", 2}, std::pair{"gptq8 avx2", 3}})
      variants.push_back({label, stored, QuantActivations::kF32, true});
  std::printf("threads %d; Qwen2.5-7B layer Linears; best of %d interleaved rounds, 512 MiB of copies each\n",
              omp_get_max_threads(), reps);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f), xdist(0.0f, 1.0f);
  // [n][variant]: the layer's time (s) and bytes
  std::map<int64_t, std::vector<double>> layer_s, layer_cpu;
  std::vector<double> layer_bytes(variants.size(), 0.0);
  for (const Shape& s : kShapes) {
    std::vector<float> w(static_cast<size_t>(s.m * s.k));
    for (float& v : w) v = dist(rng);
    std::vector<Stored> stored;
    for (const std::string& f : formats) stored.push_back(make_stored(f, s, w));
    for (size_t v = 0; v < variants.size(); ++v)
      layer_bytes[v] += static_cast<double>(stored[variants[v].stored].bytes) * s.per_layer;
    for (int64_t n : ns) {
      std::vector<float> x(static_cast<size_t>(n * s.k)), y(static_cast<size_t>(n * s.m));
      for (float& v : x) v = xdist(rng);
      std::vector<size_t> call(variants.size(), 0);
      auto one_call = [&](size_t vi) {
        const Variant& var = variants[vi];
        const Stored& st = stored[var.stored];
        if (st.format == "bf16") {
          const size_t c = call[vi]++ % st.dense.size();
          backend::matmul(x.data(), n, backend::MatrixView{st.dense[c].data(), DType::kBF16, s.m, s.k}, nullptr,
                          y.data());
        } else {
          const size_t c = call[vi]++ % st.copies.size();
          if (var.avx2) backend::quant_avx2::quant_matmul(x.data(), n, view_of(st, c, s), y.data());
          else backend::quant_matmul(x.data(), n, view_of(st, c, s), nullptr, y.data(), var.acts);
        }
      };
      for (size_t vi = 0; vi < variants.size(); ++vi) {  // warm-up: page in every copy
        const size_t copies = std::max(stored[variants[vi].stored].dense.size(), stored[variants[vi].stored].copies.size());
        for (size_t c = 0; c < copies; ++c) one_call(vi);
      }
      std::vector<double> best(variants.size(), 1e30), best_cpu(variants.size(), 1e30);
      for (int r = 0; r < reps; ++r)
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          const double c0 = cpu_seconds();
          const auto t0 = std::chrono::steady_clock::now();
          one_call(vi);
          best[vi] = std::min(best[vi], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          best_cpu[vi] = std::min(best_cpu[vi], cpu_seconds() - c0);
        }
      std::printf("%-13s %6lld x %6lld  n=%-3lld", s.name, static_cast<long long>(s.m), static_cast<long long>(s.k),
                  static_cast<long long>(n));
      for (size_t vi = 0; vi < variants.size(); ++vi)
        std::printf("  %s %.0f/%.0f us", variants[vi].label.c_str(), best[vi] * 1e6, best_cpu[vi] * 1e6);
      std::printf("  (wall/CPU)\n");
      auto& ls = layer_s[n];
      auto& lc = layer_cpu[n];
      ls.resize(variants.size(), 0.0);
      lc.resize(variants.size(), 0.0);
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        ls[vi] += best[vi] * s.per_layer;
        lc[vi] += best_cpu[vi] * s.per_layer;
      }
    }
  }
  for (int64_t n : ns) {
    std::printf("\nlayer (7 Linears), n=%lld:\n%-14s %10s %10s %10s %12s %12s\n", static_cast<long long>(n), "format",
                "wall us", "CPU us", "weight MB", "vs bf16 wall", "vs bf16 CPU");
    const auto& ls = layer_s[n];
    const auto& lc = layer_cpu[n];
    for (size_t vi = 0; vi < variants.size(); ++vi)
      std::printf("%-14s %10.0f %10.0f %10.1f %11.2fx %11.2fx\n", variants[vi].label.c_str(), ls[vi] * 1e6,
                  lc[vi] * 1e6, layer_bytes[vi] / 1e6, ls[0] / ls[vi], lc[0] / lc[vi]);
  }
  return 0;
}
