// backend/cpu/rows_gemm.h's kernel built for avx2 (flags: src/backend/CMakeLists.txt).
#define SHARDLM_ROWS_NS rows_avx2
#include "backend/cpu/rows_gemm_impl.h"
