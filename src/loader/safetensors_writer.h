// Writing safetensors checkpoints the way Hugging Face does (make-model, tests).
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON
// {"__metadata__": {"format": "pt"}, name: {dtype, shape, data_offsets}, ...}
// padded with spaces to a multiple of 8, then the data section. Tensors are
// laid out as the safetensors library does: by dtype size (largest first),
// then by name; header entries follow the data order.
//
// Tensor bytes are produced by a fill callback in chunks, so a 1 GB embedding
// is streamed to disk without ever being held whole in memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

// One tensor to write.
struct TensorToWrite {
  std::string name;            // "model.layers.0.mlp.up_proj.weight"
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // row-major; [] is a scalar
  int64_t n_elements() const;
  uint64_t n_bytes() const;
};

// Writes elements [begin, begin + count) of `tensor` into `out` as
// tensor.dtype (count * dtype_size bytes). Called with increasing, disjoint
// ranges that cover the tensor; may be called from one thread only.
using TensorFill = std::function<void(const TensorToWrite& tensor, int64_t begin, int64_t count, void* out)>;

// The header (JSON, space-padded to a multiple of 8 bytes, without the
// 8-byte length) for `tensors`, and their order in the data section.
// Throws Error(kInvalidArgument) on duplicate or empty names, negative dims.
std::string safetensors_header(const std::vector<TensorToWrite>& tensors,
                               std::vector<size_t>* data_order = nullptr,
                               const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes one safetensors file. Throws Error(kIo) naming the path if it
// cannot be written.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const TensorFill& fill);

// Convenience: tensors whose bytes are already in memory (data[i] holds
// tensors[i].n_bytes() bytes in tensors[i].dtype).
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::vector<const void*>& data);

// What write_sharded_safetensors produced.
struct ShardedWriteResult {
  std::vector<std::string> files;                  // file names, in shard order
  std::map<std::string, std::string> weight_map;   // tensor name -> file name
  uint64_t total_size = 0;                         // sum of tensor bytes (index metadata.total_size)
};

// Splits `tensors` (kept in the given order, as HF's save_pretrained keeps
// state-dict order) into n_shards files of about equal bytes, named
// model-00001-of-0000N.safetensors, and writes model.safetensors.index.json
// {"metadata": {"total_size": T}, "weight_map": {name: file}} into dir.
// n_shards == 1 writes a single model.safetensors and no index.
// Throws Error(kInvalidArgument) if n_shards < 1 or > the number of tensors.
ShardedWriteResult write_sharded_safetensors(const std::filesystem::path& dir,
                                             const std::vector<TensorToWrite>& tensors, int n_shards,
                                             const TensorFill& fill);

// "model-00002-of-00005.safetensors"
std::string shard_file_name(int shard_index, int n_shards);

}  // namespace shardlm
