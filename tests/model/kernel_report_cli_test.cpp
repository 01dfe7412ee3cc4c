// SHARDLM_KERNEL_REPORT on `shardlm generate` (backend/cpu/kernel_report.h):
// every kernel path this machine can run is forced in turn (SHARDLM_ISA,
// SHARDLM_AMX=off, --dense-activations bf16, --quant-activations, AWQ and
// GPTQ checkpoints) and must appear in the table, on every matmul, with the
// counts of the steps generate ran: a prompt of P tokens and T new tokens is
// one prefill (7 matrices per layer on P rows, the lm_head on the last row)
// then T - 1 decode steps of 7 × layers + 1 matmuls on one row.
// Paths the CPU lacks are skipped, naming what is missing.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/amx_gemm.h"
#include "backend/cpu/bf16_dot_gemm.h"
#include "core/cpu_isa.h"
#include "backend/cpu/packed_gemm.h"
#include "backend/cpu/quant_ops_int8.h"
#include "support/process.h"

namespace {

using shardlm::CpuIsa;
using shardlm::testing::run_command;
using Proc = shardlm::testing::CommandResult;

constexpr int kLayers = 2;
constexpr int kHidden = 256, kQ = 256, kKv = 128, kInter = 512, kVocab = 384;

struct Row {
  std::string path, weights, rows, mk;
  long long calls = 0;
};

// The table's rows (between the header and "end of kernel report").
std::vector<Row> parse(const std::string& text) {
  std::vector<Row> rows;
  std::istringstream in(text);
  std::string line;
  bool in_table = false;
  while (std::getline(in, line)) {
    if (line.rfind("path ", 0) == 0) {
      in_table = true;
      continue;
    }
    if (line == "end of kernel report") break;
    if (!in_table) continue;
    Row r;
    std::istringstream f(line);
    f >> r.path >> r.weights >> r.rows >> r.mk >> r.calls;
    rows.push_back(r);
  }
  return rows;
}

std::string describe(const std::vector<Row>& rows) {
  std::string s;
  for (const Row& r : rows)
    s += r.path + " " + r.weights + " " + r.rows + " " + r.mk + " " + std::to_string(r.calls) + "\n";
  return s;
}

class KernelReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* cli = std::getenv("SHARDLM_CLI");
    const char* build = std::getenv("SHARDLM_BINARY_DIR");
    cli_ = cli ? cli : SHARDLM_CLI_PATH;
    const std::string dir = std::string(build ? build : SHARDLM_BUILD_DIR) + "/tests/model";
    root_ = dir + "/kernel_report." + std::to_string(getpid());
    std::filesystem::create_directories(root_);
    // The checkpoints are made once per CLI build (ctest runs each test as its own process).
    struct stat st {};
    ASSERT_EQ(stat(cli_.c_str(), &st), 0) << cli_;
    const std::string models = dir + "/kernel_report_models." + std::to_string(st.st_mtim.tv_sec) + "." +
                               std::to_string(st.st_mtim.tv_nsec);
    bf16_ = models + "/bf16";
    awq_ = models + "/awq";
    gptq8_ = models + "/gptq-int8";
    fp8_ = models + "/fp8";
    // Widths that every kernel takes: multiples of 32 (int8 activation
    // blocks) and of the 128-wide quantization groups.
    make(bf16_, " make-model --like qwen2.5-0.5b --layers 2 --vocab 384 --hidden 256 --heads 4 --kv-heads 2 "
                "--head-dim 64 --intermediate 512 --dtype bf16 --seed 5 --out ");
    make(awq_, " quantize " + bf16_ + " --quantize awq --group-size 128 --out ");
    make(gptq8_, " quantize " + bf16_ + " --quantize gptq-int8 --group-size 128 --out ");
    make(fp8_, " quantize " + bf16_ + " --quantize fp8 --out ");
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(root_); }
  // Made under a name of this process's, then renamed into place: a
  // directory that exists is whole.
  static void make(const std::string& dir, const std::string& args) {
    if (std::filesystem::exists(dir)) return;
    const std::string mine = dir + ".making." + std::to_string(getpid());
    Proc r = run_command(cli_ + args + mine, /*merge_stderr=*/true);
    ASSERT_EQ(r.rc, 0) << r.out;
    std::error_code ec;
    std::filesystem::rename(mine, dir, ec);
    if (ec) {
      std::filesystem::remove_all(mine);
      ASSERT_TRUE(std::filesystem::exists(dir)) << "cannot rename " << mine << ": " << ec.message();
    }
  }

  // Runs generate with `env` and `flags` on a prompt of `prompt` tokens for
  // `tokens` new ones; returns the table's rows.
  static std::vector<Row> report(const std::string& model, const std::string& env, int prompt, int tokens,
                                 const std::string& flags = "") {
    static int n = 0;
    const std::string file = root_ + "/report." + std::to_string(n++) + ".txt";
    std::string ids;
    for (int i = 0; i < prompt; ++i) ids += (i ? "," : "") + std::to_string(3 + 7 * i % 300);
    Proc r = run_command("SHARDLM_KERNEL_REPORT=" + file + " " + env + " " + cli_ + " generate " + model +
                             " --prompt-ids " + ids + " --max-tokens " + std::to_string(tokens) + " " + flags,
                         /*merge_stderr=*/true);
    EXPECT_EQ(r.rc, 0) << r.out;
    const std::string text = shardlm::testing::read_text_file(file);
    EXPECT_NE(text.find("kernel report (pid "), std::string::npos) << text;
    return parse(text);
  }

  // The calls on path for weights, over the rows bucket (any when "").
  static long long calls(const std::vector<Row>& rows, const std::string& path, const std::string& weights,
                         const std::string& bucket = "") {
    long long c = 0;
    for (const Row& r : rows)
      if (r.path == path && r.weights == weights && (bucket.empty() || r.rows == bucket)) c += r.calls;
    return c;
  }
  static long long total(const std::vector<Row>& rows) {
    long long c = 0;
    for (const Row& r : rows) c += r.calls;
    return c;
  }
  // The decoder matrices of one forward pass: q, k, v, o, gate, up, down per layer.
  static constexpr long long kPerPass = 7LL * kLayers;

  static std::string cli_, root_, bf16_, awq_, gptq8_, fp8_;
};
std::string KernelReport::cli_, KernelReport::root_, KernelReport::bf16_, KernelReport::awq_, KernelReport::gptq8_,
    KernelReport::fp8_;

// Decode (one row) on the rows kernel of each ISA the CPU has, prefill of 5
// rows too; every matmul of the run is there: 4 passes of 7 × 2 matrices plus
// 4 lm_heads, and each matrix shape per pass.
TEST_F(KernelReport, RowsKernelOfEveryIsaTheCpuRuns) {
  const std::map<CpuIsa, std::string> names = {
      {CpuIsa::kScalar, "scalar"}, {CpuIsa::kAvx2, "avx2"}, {CpuIsa::kAvx512, "avx512"}};
  for (const auto& [isa, name] : names) {
    if (static_cast<int>(isa) > static_cast<int>(shardlm::detected_cpu_isa())) {
      std::cout << "this CPU lacks " << name << ": not run\n";
      continue;
    }
    SCOPED_TRACE("SHARDLM_ISA=" + name);
    const auto rows = report(bf16_, "SHARDLM_ISA=" + name, 5, 4);
    const std::string path = "rows/" + name;
    EXPECT_EQ(total(rows), 4 * kPerPass + 4) << describe(rows);
    EXPECT_EQ(calls(rows, path, "bf16"), 4 * kPerPass + 4) << describe(rows);
    EXPECT_EQ(calls(rows, path, "bf16", "5-8"), kPerPass) << describe(rows);  // the prefill
    EXPECT_EQ(calls(rows, path, "bf16", "1"), 3 * kPerPass + 4) << describe(rows);
    for (const std::string& mk : {std::to_string(kQ) + "x" + std::to_string(kHidden),
                                  std::to_string(kKv) + "x" + std::to_string(kHidden),
                                  std::to_string(kHidden) + "x" + std::to_string(kQ),
                                  std::to_string(kInter) + "x" + std::to_string(kHidden),
                                  std::to_string(kHidden) + "x" + std::to_string(kInter),
                                  std::to_string(kVocab) + "x" + std::to_string(kHidden)}) {
      long long c = 0;
      for (const Row& r : rows)
        if (r.mk == mk) c += r.calls;
      // Per layer and pass: q and o (both 256x256), k and v (128x256), gate
      // and up (512x256), down (256x512) once; the lm_head once per pass.
      const long long per_pass = mk == std::to_string(kVocab) + "x" + std::to_string(kHidden) ? 1
                                 : mk == std::to_string(kHidden) + "x" + std::to_string(kInter) ? kLayers
                                                                                                : 2 * kLayers;
      EXPECT_EQ(c, 4 * per_pass) << mk << "\n" << describe(rows);
    }
  }
}

// A prefill of 40 rows takes the packed GEMM (32 rows and more; 8 on AMX):
// on AMX tiles where the CPU and OS allow it, the AVX GEMM with SHARDLM_AMX=off.
TEST_F(KernelReport, PackedGemmWithAndWithoutAmx) {
  if (!shardlm::backend::packed_matmul_available(shardlm::DType::kBF16))
    GTEST_SKIP() << "this build has no packed GEMM (built for a baseline CPU: -DSHARDLM_NATIVE=OFF)";
  const auto off = report(bf16_, "SHARDLM_AMX=off", 40, 3);
  long long packed = 0;
  for (const Row& r : off)
    if (r.path.rfind("packed/", 0) == 0) {
      EXPECT_NE(r.path, "packed/amx") << describe(off);
      EXPECT_EQ(r.rows, "33-64") << describe(off);
      packed += r.calls;
    }
  EXPECT_EQ(packed, kPerPass) << describe(off);
  EXPECT_EQ(total(off), 3 * kPerPass + 3) << describe(off);
  const auto on = report(bf16_, "", 40, 3);
  if (shardlm::backend::amx_available()) {
    EXPECT_EQ(calls(on, "packed/amx", "bf16", "33-64"), kPerPass) << describe(on);
  } else {
    std::cout << "no AMX here (CPU or OS): the default run takes the AVX GEMM too\n";
    EXPECT_EQ(calls(on, "packed/amx", "bf16"), 0) << describe(on);
    EXPECT_EQ(total(on), total(off)) << describe(on);
  }
}

// --dense-activations bf16: every bf16 matmul, lm_head included, on the
// AVX512_BF16 dot-product kernel, whatever the rows.
TEST_F(KernelReport, Bf16ActivationsTakeTheBf16DotKernel) {
  if (!shardlm::backend::bf16_dot_gemm_runs())
    GTEST_SKIP() << "bf16 activations: " << shardlm::backend::bf16_dot_gemm_missing();
  const auto rows = report(bf16_, "", 40, 3, "--dense-activations bf16");
  EXPECT_EQ(calls(rows, "bf16dot/avx512bf16", "bf16"), 3 * kPerPass + 3) << describe(rows);
  EXPECT_EQ(total(rows), 3 * kPerPass + 3) << describe(rows);
}

// AWQ and GPTQ-int8: int8 activations on the VNNI kernels by default, the
// f32 kernels with --quant-activations f32, the AVX2 ones under
// SHARDLM_ISA=avx2; the (unquantized, tied) lm_head stays on rows.
TEST_F(KernelReport, QuantizedCheckpointsTakeTheirKernels) {
  const bool int8 = shardlm::backend::int8_activation_kernels_built() &&
                    shardlm::detected_cpu_isa() >= CpuIsa::kAvx512;
  // The AVX-512 quantized kernels are compiled in only when the build targets AVX-512 (the
  // library's files and this one share the build's flags); the AVX2 ones always are.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  const bool avx512 = shardlm::detected_cpu_isa() >= CpuIsa::kAvx512;
#else
  const bool avx512 = false;
#endif
  const std::vector<std::pair<std::string, std::string>> checkpoints = {{awq_, "awq-int4"}, {gptq8_, "gptq-int8"}};
  for (const auto& [model, weights] : checkpoints) {
    SCOPED_TRACE(weights);
    const auto def = report(model, "", 5, 3);
    EXPECT_EQ(total(def), 3 * kPerPass + 3) << describe(def);
    EXPECT_EQ(calls(def, int8 ? "int8/vnni" : (avx512 ? "quant/avx512" : "quant/avx2"), weights), 3 * kPerPass)
        << describe(def);
    const auto f32 = report(model, "", 5, 3, "--quant-activations f32");
    EXPECT_EQ(calls(f32, avx512 ? "quant/avx512" : "quant/avx2", weights), 3 * kPerPass) << describe(f32);
    if (shardlm::detected_cpu_isa() >= CpuIsa::kAvx2) {
      const auto avx2 = report(model, "SHARDLM_ISA=avx2", 5, 3);
      EXPECT_EQ(calls(avx2, "quant/avx2", weights), 3 * kPerPass) << describe(avx2);
      EXPECT_EQ(calls(avx2, "rows/avx2", "bf16"), 3) << describe(avx2);  // the lm_head
    }
    const auto scalar = report(model, "SHARDLM_ISA=scalar", 5, 2);
    EXPECT_EQ(calls(scalar, "quant/scalar", weights), 2 * kPerPass) << describe(scalar);
  }
}

// FP8 (blocks 128×128): the prefill of 40 rows through the packed GEMM
// (panels widened and scaled as they are packed), decode on the FP8 rows kernel.
TEST_F(KernelReport, Fp8PrefillPackedDecodeRows) {
  if (shardlm::detected_cpu_isa() < CpuIsa::kAvx2) GTEST_SKIP() << "no SIMD FP8 kernels on this CPU";
  if (!shardlm::backend::packed_matmul_available(shardlm::DType::kF8E4M3))
    GTEST_SKIP() << "this build has no packed FP8 GEMM (built for a baseline CPU: -DSHARDLM_NATIVE=OFF)";
  const auto rows = report(fp8_, "", 40, 3);
  long long packed = 0;
  for (const Row& r : rows)
    if (r.path.rfind("packed/", 0) == 0 && r.weights == "fp8" && r.rows == "33-64") packed += r.calls;
  EXPECT_EQ(packed, kPerPass) << describe(rows);
  EXPECT_EQ(calls(rows, "fp8rows/simd", "fp8", "1"), 2 * kPerPass) << describe(rows);
  EXPECT_EQ(total(rows), 3 * kPerPass + 3) << describe(rows);
}

// Unset or "0": no table, nothing counted.
TEST_F(KernelReport, OffByDefault) {
  Proc r = run_command(cli_ + " generate " + bf16_ + " --prompt-ids 3,4 --max-tokens 2", /*merge_stderr=*/true);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("kernel report"), std::string::npos) << r.out;
  r = run_command("SHARDLM_KERNEL_REPORT=1 " + cli_ + " generate " + bf16_ + " --prompt-ids 3,4 --max-tokens 2",
                  /*merge_stderr=*/true);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("end of kernel report"), std::string::npos) << r.out;  // "1": on stderr
}

}  // namespace
