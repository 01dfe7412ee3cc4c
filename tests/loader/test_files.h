// Test helpers: a tiny safetensors writer (independent of the reader under
// test) and scratch directories under the build tree.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::testing {

struct RawTensor {
  std::string name;
  std::string dtype;            // "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;    // raw bytes, written as-is
};

// A well-formed image: tensors laid out back to back in the given order,
// header padded with spaces to a multiple of 8 (as the Python writer does).
std::vector<uint8_t> make_safetensors(const std::vector<RawTensor>& tensors,
                                      std::string_view metadata_json = "");
// An image from header text and data bytes exactly as given; the header is
// padded with spaces to pad_to bytes when pad_to > its length.
std::vector<uint8_t> make_raw(std::string_view header_json, std::span<const uint8_t> data,
                              size_t pad_to = 0);

// F32 tensor with values start, start+1, ...
RawTensor f32_tensor(std::string name, std::vector<int64_t> shape, float start = 0.0f);
// BF16 tensor, every element `value`.
RawTensor bf16_tensor(std::string name, std::vector<int64_t> shape, float value = 1.0f);

void write_bytes(const std::filesystem::path& path, std::span<const uint8_t> bytes);
void write_text(const std::filesystem::path& path, std::string_view text);
std::vector<uint8_t> read_bytes(const std::filesystem::path& path);
std::string read_text(const std::filesystem::path& path);

// An empty directory $SHARDLM_BINARY_DIR/test_tmp/loader/<name> (or under
// the system temp dir when the variable is unset).
std::filesystem::path fresh_dir(std::string_view name);

// A tiny Qwen2-shaped config.json: vocab 32, hidden 16, intermediate 32,
// 2 layers, 4 heads of 4, 2 KV heads, bf16, untied: 27 tensors.
extern const char* const kTinyConfig;

struct TinyModelOptions {
  int n_shards = 1;                                 // >1: model-0000i-of-0000N + index
  std::set<std::string> drop;                       // tensors left out (of files and index)
  std::map<std::string, std::string> rename;        // in the shard only; the index keeps the old name
  std::map<std::string, std::vector<int64_t>> reshape;
  std::map<std::string, std::string> f32;           // tensors written as F32 (value ignored)
  std::vector<RawTensor> extra;                     // added to the last shard and the index
  bool tokenizer = true;                            // write tokenizer.json and tokenizer_config.json
};

// Writes config.json, the weights of every tensor config.json implies (bf16,
// values 1.0; shard i holds a contiguous run of them) and the tokenizer files.
// Returns the tensor names in each shard.
std::vector<std::vector<std::string>> write_tiny_model(const std::filesystem::path& dir,
                                                       const std::string& config_json,
                                                       const TinyModelOptions& options = {});

// "model-00002-of-00003.safetensors"
std::string shard_name(int i, int n);

// The shardlm binary: $SHARDLM_CLI, or the path CMake compiled in.
std::string cli_path();

}  // namespace shardlm::testing
