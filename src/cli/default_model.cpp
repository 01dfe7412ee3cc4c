#include "cli/default_model.h"

#include <unistd.h>

#include <iostream>
#include <system_error>

#include "core/error.h"

namespace shardlm::cli {

namespace {

std::filesystem::path executable_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

}  // namespace

std::vector<std::filesystem::path> default_model_candidates() {
  std::vector<std::filesystem::path> out;
  const auto bin = executable_dir();
  if (!bin.empty()) {
    out.push_back((bin / ".." / "share" / "shardlm" / "models" / kDefaultModelName).lexically_normal());
    out.push_back(bin / "models" / kDefaultModelName);
  }
#ifdef SHARDLM_SOURCE_DIR
  out.push_back(std::filesystem::path(SHARDLM_SOURCE_DIR) / "models" / kDefaultModelName);
#endif
  return out;
}

std::string resolve_model_dir(const std::string& given, const char* command) {
  if (!given.empty()) return given;
  std::string searched;
  for (const auto& dir : default_model_candidates()) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(dir / "config.json", ec) &&
        std::filesystem::is_regular_file(dir / "model.safetensors", ec)) {
      std::cerr << "shardlm " << command << ": no MODEL given; using the demo model " << dir.string() << "\n";
      return dir.string();
    }
    searched += "\n  " + dir.string();
  }
  fail(ErrorCode::kNotFound, command, ": no MODEL given and the demo model (", kDefaultModelName,
       ") is not installed; looked in:", searched,
       "\nname a model directory (config.json, *.safetensors, tokenizer.json), or run `cmake --install` to install it");
}

}  // namespace shardlm::cli
