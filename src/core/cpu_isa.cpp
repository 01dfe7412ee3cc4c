#include "core/cpu_isa.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/error.h"

namespace shardlm {

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512bf16";
  }
  return "scalar";
}

CpuIsa detected_cpu_isa() {
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")))
      return CpuIsa::kScalar;
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
      return CpuIsa::kAvx2;
    // AVX512_BF16: CPUID leaf 7 sub-leaf 1, EAX bit 5.
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) return CpuIsa::kAvx512Bf16;
    return CpuIsa::kAvx512;
  }();
  return isa;
}

CpuIsa active_cpu_isa() {
  static const CpuIsa isa = [] {
    const CpuIsa have = detected_cpu_isa();
    const char* env = std::getenv("SHARDLM_ISA");
    if (!env || !*env) return have;
    const std::string_view want(env);
    for (CpuIsa i : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
      if (want != cpu_isa_name(i)) continue;
      if (static_cast<int>(i) > static_cast<int>(have))
        fail(ErrorCode::kInvalidArgument, "SHARDLM_ISA=", want, ": this CPU runs at most ", cpu_isa_name(have),
             " (unset SHARDLM_ISA, or choose a lower path)");
      return i;
    }
    fail(ErrorCode::kInvalidArgument, "SHARDLM_ISA=", want,
         ": expected one of avx512bf16, avx512, avx2, scalar (or unset it for the best this CPU runs)");
  }();
  return isa;
}

std::string cpu_model_name() {
  unsigned regs[12] = {};
  unsigned max_ext = __get_cpuid_max(0x80000000u, nullptr);
  if (max_ext < 0x80000004u) return "unknown CPU";
  for (unsigned leaf = 0; leaf < 3; ++leaf)
    __get_cpuid(0x80000002u + leaf, &regs[4 * leaf], &regs[4 * leaf + 1], &regs[4 * leaf + 2], &regs[4 * leaf + 3]);
  char name[49] = {};
  std::memcpy(name, regs, 48);
  std::string s(name);
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "unknown CPU" : s.substr(b, e - b + 1);
}

}  // namespace shardlm
