// Exact checkpoint sizes for plan from the safetensors headers alone: the
// 8-byte little-endian header length and the JSON header of each file, never
// the tensor data. (The loader layer owns full validation and mmap.)
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loader/model_spec.h"

namespace shardlm {

struct HeaderTensor {
  std::string file;            // "model-00001-of-00004.safetensors"
  std::string dtype;           // safetensors spelling: "BF16"
  std::vector<int64_t> shape;  // as stored
  int64_t bytes = 0;           // data_offsets[1] - data_offsets[0]
};

struct CheckpointHeaders {
  std::map<std::string, HeaderTensor> tensors;  // by HF tensor name
  int n_files = 0;
  int64_t total_bytes = 0;  // sum of tensor bytes over all files
  std::string dtype;        // the single dtype of every tensor, "" when mixed
};

// Reads every *.safetensors header in `dir`. Returns n_files == 0 when there
// are none. Throws Error(kCorruptFile) naming the file for a truncated or
// malformed header, or a tensor whose byte count disagrees with dtype × shape.
CheckpointHeaders read_checkpoint_headers(const std::filesystem::path& dir);

// Throws Error(kCorruptFile) naming the file and tensor when a tensor the spec
// requires is missing or has another shape than config.json implies.
void check_headers_match_spec(const CheckpointHeaders& headers, const ModelSpec& spec);

}  // namespace shardlm
