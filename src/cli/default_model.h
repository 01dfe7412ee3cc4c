// The model `serve` and `generate` use when none is named: the demo model the
// project trains (models/shardlm-demo, see its README). Looked for, in order:
//   <bin>/../share/shardlm/models/shardlm-demo   (cmake --install)
//   <bin>/models/shardlm-demo                    (next to the binary)
//   <source tree>/models/shardlm-demo            (a build tree)
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace shardlm::cli {

inline constexpr const char* kDefaultModelName = "shardlm-demo";

// The directories searched, in order.
std::vector<std::filesystem::path> default_model_candidates();

// `given` when not empty; else the first candidate holding config.json (said
// on stderr). Throws kNotFound listing the places searched when none does.
std::string resolve_model_dir(const std::string& given, const char* command);

}  // namespace shardlm::cli
