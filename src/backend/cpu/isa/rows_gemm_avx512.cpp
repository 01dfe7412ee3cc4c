// backend/cpu/rows_gemm.h's kernel built for avx512 (flags: src/backend/CMakeLists.txt).
#define SHARDLM_ROWS_NS rows_avx512
#include "backend/cpu/rows_gemm_impl.h"
