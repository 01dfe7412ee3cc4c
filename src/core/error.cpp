#include "core/error.h"

namespace shardlm {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kCorruptFile: return "corrupt_file";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kOutOfMemory: return "out_of_memory";
    case ErrorCode::kIo: return "io_error";
    case ErrorCode::kDistributed: return "distributed_error";
    case ErrorCode::kInternal: return "internal_error";
  }
  return "unknown";
}

}  // namespace shardlm
