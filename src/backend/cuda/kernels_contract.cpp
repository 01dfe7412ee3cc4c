// The kernels read StepMetadata's packed layout directly (kernels.h), but
// .cu files are C++17 and cannot include it (std::span); this keeps the two
// record layouts the same at compile time.
#include "backend/cuda/kernels.h"
#include "backend/step_metadata.h"

namespace shardlm::backend::cuda {

static_assert(kSeqRecord == StepMetadata::kSeqRecord,
              "kernels.h's DeviceSeqs record must be StepMetadata's (token_begin, n_tokens, n_past, table_offset, n_table)");

}  // namespace shardlm::backend::cuda
