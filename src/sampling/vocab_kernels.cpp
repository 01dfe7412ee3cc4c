#include "sampling/vocab_kernels.h"

#include "core/cpu_isa.h"

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

namespace {
VocabIsa vocab_isa_of(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
    case CpuIsa::kAvx512: return VocabIsa::kAvx512;
    case CpuIsa::kAvx2: return VocabIsa::kAvx2;
    case CpuIsa::kScalar: break;
  }
  return VocabIsa::kScalar;
}
}  // namespace

bool vocab_isa_supported(VocabIsa isa) {
  return static_cast<int>(isa) <= static_cast<int>(vocab_isa_of(detected_cpu_isa()));
}

VocabIsa active_vocab_isa() {
  static const VocabIsa isa = vocab_isa_of(active_cpu_isa());
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
