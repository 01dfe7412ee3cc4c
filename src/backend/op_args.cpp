// The names of backend/op_args.h's types, for messages.
#include "backend/op_args.h"

namespace shardlm::backend {

const char* weight_scheme_name(WeightScheme scheme) {
  switch (scheme) {
    case WeightScheme::kDense: return "dense";
    case WeightScheme::kAwq: return "awq";
    case WeightScheme::kGptq: return "gptq";
    case WeightScheme::kFp8: return "fp8";
  }
  return "?";
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kMatmul: return "matmul";
    case Op::kPagedAttention: return "paged_attention";
    case Op::kSampleRows: return "sample_rows";
    case Op::kMoe: return "moe";
    case Op::kKvGroups: return "kv_groups";
  }
  return "?";
}

}  // namespace shardlm::backend
