// A problem found in a model directory: what `shardlm verify` lists and what
// strict loading throws. Checks collect every problem instead of stopping at
// the first, so one run tells the user everything that is wrong.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace shardlm {

enum class Severity {
  kError,    // loading refuses the checkpoint
  kWarning,  // loading accepts it (e.g. unused bytes between tensors); verify still reports it
};

struct Problem {
  Severity severity = Severity::kError;
  ErrorCode code = ErrorCode::kCorruptFile;
  std::string file;     // file name relative to the model directory ("model-00002-of-00004.safetensors")
  std::string tensor;   // empty when the problem is not about one tensor
  std::string message;  // what is wrong, expected vs found
  std::string fix;      // what the user should do

  // "FILE: MESSAGE; FIX"
  std::string text() const;
};

// Throws an Error for the first kError problem, mentioning how many more there
// are and `hint` (e.g. "run `shardlm verify DIR` to list them"); does nothing
// when there is none.
void throw_first_error(const std::vector<Problem>& problems, const std::string& hint);

bool has_errors(const std::vector<Problem>& problems);

}  // namespace shardlm
