// backend/cpu/rows_gemm.h's kernel built for scalar (flags: src/backend/CMakeLists.txt).
#define SHARDLM_ROWS_NS rows_scalar
#include "backend/cpu/rows_gemm_impl.h"
