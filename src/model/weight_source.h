// Where a rank's weights come from: tensors by HF name, in their checkpoint
// dtype, without copying. A checkpoint directory (mmap'd safetensors) in
// production; buffers built in memory in tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

// A whole tensor as stored: row-major, checkpoint dtype.
struct WeightRef {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // nullptr when the tensor is absent.
  virtual const WeightRef* find(const std::string& name) const = 0;
  // Names the source in error messages ("checkpoint /models/qwen").
  virtual std::string describe() const = 0;
};

// Tensors held in memory (tests, make-model). Owns its buffers.
class MemoryWeightSource final : public WeightSource {
 public:
  // bytes.size() must equal product(shape) × dtype size.
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  const WeightRef* find(const std::string& name) const override;
  std::string describe() const override { return "in-memory weights"; }

 private:
  struct Entry {
    WeightRef ref;
    std::vector<uint8_t> bytes;
  };
  std::map<std::string, std::unique_ptr<Entry>> tensors_;
};

// Every *.safetensors file of an HF model directory, memory-mapped.
std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& model_dir);

}  // namespace shardlm
