// Tensors: a contiguous row-major array (rank <= 4) of one dtype on one
// device. Weights, the KV cache, activations and logits are all Tensors.
//
// A Tensor either shares ownership of its storage (copies of the Tensor keep
// it alive) or is a view of memory that something else keeps alive (a
// checkpoint mapping, another Tensor's storage). Copying a Tensor never copies
// elements. Which device the memory is on is a tag: only the backend that
// made a device tensor dereferences it.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace shardlm {

enum class DeviceKind { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool is_cpu() const { return kind == DeviceKind::kCpu; }
  std::string to_string() const;  // "cpu", "cuda:1"
  bool operator==(const Device&) const = default;
};

// Up to four extents; unused trailing extents are absent (rank counts them).
class TensorShape {
 public:
  static constexpr int kMaxRank = 4;
  TensorShape() = default;
  TensorShape(std::initializer_list<int64_t> dims);
  explicit TensorShape(std::span<const int64_t> dims);
  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::vector<int64_t> to_vector() const { return {dims_.begin(), dims_.begin() + rank_}; }
  std::string to_string() const;  // "[896, 4864]"
  bool operator==(const TensorShape& o) const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class Tensor {
 public:
  Tensor() = default;

  // A view of memory kept alive elsewhere.
  static Tensor view(const void* data, DType dtype, TensorShape shape, Device device = {});
  // A tensor that shares ownership of `storage`; data points into it.
  static Tensor owning(std::shared_ptr<void> storage, void* data, DType dtype, TensorShape shape,
                       Device device = {});
  // A zero-filled host tensor on the heap (staging a column slice, tests).
  static Tensor host(DType dtype, TensorShape shape);

  bool defined() const { return data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const TensorShape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool owns_storage() const { return storage_ != nullptr; }

  void* data() const { return data_; }
  // Typed element pointer; throws Error(kInternal) when T's size is not the dtype's.
  template <class T>
  T* ptr() const {
    check_element_size(sizeof(T));
    return static_cast<T*>(data_);
  }

  // Rows [begin, end) of dimension 0, sharing this tensor's storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;
  // The same elements under another shape of equal numel.
  Tensor reshape(TensorShape shape) const;
  // "bf16[896, 4864] on cpu"
  std::string describe() const;

 private:
  void check_element_size(size_t size) const;

  std::shared_ptr<void> storage_;  // null for views
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  TensorShape shape_;
  Device device_;
};

}  // namespace shardlm
