// Which instruction set the CPU kernels built for several run on (the
// backend's matmul kernels, the sampler's vocabulary passes),
// chosen at run time from CPUID, so one binary takes the best path on an
// Intel Xeon (AMX, AVX-512), an AMD EPYC Zen 4/5 (AVX-512, AVX-512-BF16,
// no AMX) or an AVX2-only machine. The variable SHARDLM_ISA caps the choice
// (avx512bf16, avx512, avx2 or scalar: a path the CPU lacks is refused, not
// faked), so a test can run every path this machine has.
#pragma once

#include <string>

namespace shardlm {

enum class CpuIsa { kScalar, kAvx2, kAvx512, kAvx512Bf16 };

const char* cpu_isa_name(CpuIsa isa);  // "scalar", "avx2", "avx512", "avx512bf16"

// What CPUID says (AVX2 needs FMA and F16C too; AVX-512 needs F, BW, VL and
// DQ: the flags the AVX-512 translation units are compiled with).
CpuIsa detected_cpu_isa();

// detected_cpu_isa(), capped by SHARDLM_ISA when set (read once). Throws
// Error(kInvalidArgument) naming the variable for a value that is not one of
// the four names, or one the CPU does not have.
CpuIsa active_cpu_isa();

// The CPU's brand string from CPUID ("AMD EPYC 9B45", ...), for reports.
std::string cpu_model_name();

}  // namespace shardlm
