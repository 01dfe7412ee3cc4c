#include "sampling/vocab_kernels.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace shardlm {

// The tables of sampling/isa/vocab_kernels_*.cpp.
const VocabKernels& vocab_kernels_scalar();
const VocabKernels& vocab_kernels_avx2();
const VocabKernels& vocab_kernels_avx512();

const char* vocab_isa_name(VocabIsa isa) {
  switch (isa) {
    case VocabIsa::kScalar: return "scalar";
    case VocabIsa::kAvx2: return "avx2";
    case VocabIsa::kAvx512: return "avx512";
  }
  return "scalar";
}

bool vocab_isa_supported(VocabIsa isa) {
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  static const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case VocabIsa::kScalar: return true;
    case VocabIsa::kAvx2: return avx2;
    case VocabIsa::kAvx512: return avx512;
  }
  return false;
}

VocabIsa active_vocab_isa() {
  static const VocabIsa isa = [] {
    VocabIsa best = VocabIsa::kScalar;
    for (VocabIsa i : {VocabIsa::kAvx2, VocabIsa::kAvx512})
      if (vocab_isa_supported(i)) best = i;
    const char* env = std::getenv("SHARDLM_ISA");
    if (!env || !*env) return best;
    const std::string_view want(env);
    // The backend's names (backend/cpu/cpu_isa.h); avx512bf16 adds nothing here.
    const VocabIsa cap = want == "avx512bf16" || want == "avx512" ? VocabIsa::kAvx512
                         : want == "avx2"                         ? VocabIsa::kAvx2
                         : want == "scalar"                       ? VocabIsa::kScalar
                                                                  : static_cast<VocabIsa>(-1);
    if (static_cast<int>(cap) < 0)
      fail(ErrorCode::kInvalidArgument, "SHARDLM_ISA=", want,
           ": expected one of avx512bf16, avx512, avx2, scalar (or unset it for the best this CPU runs)");
    if (!vocab_isa_supported(cap))
      fail(ErrorCode::kInvalidArgument, "SHARDLM_ISA=", want, ": this CPU runs the sampler's kernels at most as ",
           vocab_isa_name(best), " (unset SHARDLM_ISA, or choose a lower path)");
    return cap;
  }();
  return isa;
}

const VocabKernels& vocab_kernels(VocabIsa isa) {
  switch (isa) {
    case VocabIsa::kAvx512: return vocab_kernels_avx512();
    case VocabIsa::kAvx2: return vocab_kernels_avx2();
    case VocabIsa::kScalar: break;
  }
  return vocab_kernels_scalar();
}

const VocabKernels& vocab_kernels() {
  static const VocabKernels& k = vocab_kernels(active_vocab_isa());
  return k;
}

}  // namespace shardlm
