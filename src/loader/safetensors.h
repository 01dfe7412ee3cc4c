// safetensors files: an 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {..}},
// then the data section, which data_offsets index from its first byte.
//
// Reading is strict: every field of the header is checked against the file,
// and each problem names the file, the tensor and expected vs found. Tensor
// data is never copied: views point into a read-only mapping of the file and
// keep the checkpoint dtype.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "loader/mapped_file.h"
#include "loader/model_spec.h"  // shape_string
#include "loader/problem.h"

namespace shardlm {

// Headers larger than this are treated as corrupt (real ones are < 1 MB).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// One tensor as the header describes it.
struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;       // as written: "BF16", "I64", ...
  std::optional<DType> dtype;   // set when shardlm supports dtype_name
  std::vector<int64_t> shape;   // [] for a scalar
  uint64_t begin = 0;           // data_offsets[0], relative to the data section
  uint64_t end = 0;             // data_offsets[1]
  // Supported dtype, byte count equal to product(shape) x dtype size, and
  // inside the file: a TensorView can be made of it.
  bool usable = false;
};

struct SafetensorsHeader {
  std::string file;             // the name problems are reported under
  uint64_t file_size = 0;
  uint64_t header_size = 0;     // N, from the first 8 bytes
  uint64_t data_start = 0;      // 8 + N: file offset of the data section
  // The header JSON was read (an object); tensors lists what it names. False
  // when the file is too short, the length is wrong or the JSON is broken.
  bool parsed = false;
  // Entries whose shape and data_offsets are well formed, sorted by begin
  // (bad dtypes or byte counts are still listed; their problems say so).
  std::vector<SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  // Everything wrong with the file. kWarning: unused bytes between tensors or
  // after the last one (loading accepts them; verify reports them).
  std::vector<Problem> problems;

  bool ok() const { return !has_errors(problems); }
};

// Parses and checks a whole safetensors file image (bytes.size() is the file
// size). Never throws on malformed input: every problem goes into .problems.
// Safe on arbitrary bytes (this is the fuzzing entry point).
SafetensorsHeader parse_safetensors_header(std::span<const uint8_t> file_bytes,
                                           std::string_view file_name);

// A tensor inside a mapped file. Row-major, checkpoint dtype.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;   // e.g. [n_out, n_in] for a Linear weight
  const void* data = nullptr;   // into the mapping; alignment is whatever the file gives
  size_t n_bytes = 0;

  int64_t n_elements() const;
  int rank() const { return static_cast<int>(shape.size()); }
  // Bytes of one step along dim 0 (n_bytes for a scalar).
  size_t row_bytes() const;
};

// Rows [r0, r1) along dim 0 (elements of a 1-D tensor): a contiguous view of
// the same mapping with shape[0] = r1 - r0. This is how a rank reads its slice
// of q/k/v/gate/up (split over output features) or of a bias. Throws
// kInvalidArgument, naming the tensor, if the range is outside [0, shape[0]].
TensorView slice_rows(const TensorView& tensor, int64_t r0, int64_t r1);

// Columns [c0, c1) of a 2-D tensor [n_rows, n_cols] are strided in the file:
// copies them to dst as [n_rows, c1 - c0] in tensor.dtype (o_proj, down_proj
// split over input features). dst must hold n_rows * (c1 - c0) elements.
void copy_columns(const TensorView& tensor, int64_t c0, int64_t c1, void* dst);

// The block [r0, r1) x [c0, c1) of a 2-D tensor, copied to dst as
// [r1 - r0, c1 - c0] in tensor.dtype.
void copy_block(const TensorView& tensor, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                void* dst);

class SafetensorsFile {
 public:
  // Maps the file and checks it; throws an Error carrying the first error
  // (kCorruptFile, kUnsupported; kNotFound / kIo if it cannot be opened).
  // Warnings (unused bytes) do not throw; see header().problems.
  // display_name: the name used in messages (default: the file name).
  static SafetensorsFile open(const std::filesystem::path& path, std::string display_name = "");
  // Maps and parses without throwing on content problems: they are in
  // header().problems, and tensors() holds only the entries that are usable
  // (supported dtype, right byte count, inside the file). Throws only when
  // the file cannot be opened or mapped.
  static SafetensorsFile inspect(const std::filesystem::path& path, std::string display_name = "");

  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::filesystem::path& path() const { return path_; }
  const std::string& name() const { return header_.file; }
  uint64_t file_size() const { return header_.file_size; }
  const SafetensorsHeader& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // In data order.
  const std::vector<TensorView>& tensors() const { return views_; }
  // nullptr when absent.
  const TensorView* find(std::string_view name) const;
  // Throws kNotFound naming the file.
  const TensorView& at(std::string_view name) const;
  // Sum of the usable tensors' n_bytes.
  uint64_t tensor_bytes() const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  MappedFile map_;
  SafetensorsHeader header_;
  std::vector<TensorView> views_;
  std::unordered_map<std::string, size_t> by_name_;
};

}  // namespace shardlm
