// `shardlm verify`: checks every file a load would read, collecting every
// problem (not just the first), each naming the file and what to do.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loader/model_spec.h"
#include "loader/problem.h"

namespace shardlm {

struct VerifyOptions {
  bool sha256 = false;                            // hash every file a load reads
  std::optional<std::filesystem::path> manifest;  // `sha256sum` output to compare with (implies sha256)
};

struct VerifiedFile {
  std::string name;      // relative to the model directory
  std::string role;      // "config", "index", "weights", "tokenizer", "tokenizer_config", "generation_config"
  bool present = false;
  uint64_t bytes = 0;
  size_t n_tensors = 0;  // weights files: tensors in the header
  std::string sha256;    // lowercase hex, when hashed
};

struct VerifyReport {
  std::filesystem::path dir;
  std::optional<ModelSpec> spec;      // when config.json parsed
  std::vector<Problem> problems;      // errors and warnings, all reported
  std::vector<VerifiedFile> files;    // in the order checked
  std::vector<std::string> notes;     // facts that are not problems
  size_t n_tensors = 0;               // usable tensors
  uint64_t tensor_bytes = 0;          // their bytes
  size_t n_manifest_matches = 0;      // files whose SHA-256 equals the manifest's

  bool ok() const { return problems.empty(); }
};

// Throws kNotFound if dir does not exist, kInvalidArgument if it is not a
// directory, kNotFound if the manifest cannot be read. Everything else is a
// problem in the report.
VerifyReport verify_model_dir(const std::filesystem::path& dir, const VerifyOptions& options = {});

}  // namespace shardlm
