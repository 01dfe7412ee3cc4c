#include "core/tensor.h"

#include <cstdlib>
#include <cctype>
#include <cstring>

#include "core/error.h"

namespace shardlm {

std::string Device::to_string() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

TensorShape::TensorShape(std::initializer_list<int64_t> dims) : TensorShape(std::span<const int64_t>(dims)) {}

TensorShape::TensorShape(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank))
    fail(ErrorCode::kInternal, "tensor of rank ", dims.size(), ": at most ", kMaxRank, " dimensions");
  for (int64_t d : dims)
    if (d < 0) fail(ErrorCode::kInternal, "tensor extent ", d, " is negative");
  rank_ = static_cast<int>(dims.size());
  for (int i = 0; i < rank_; ++i) dims_[static_cast<size_t>(i)] = dims[static_cast<size_t>(i)];
}

int64_t TensorShape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

std::string TensorShape::to_string() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + "]";
}

bool TensorShape::operator==(const TensorShape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

Tensor Tensor::view(const void* data, DType dtype, TensorShape shape, Device device) {
  Tensor t;
  t.data_ = const_cast<void*>(data);
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.device_ = device;
  return t;
}

Tensor Tensor::owning(std::shared_ptr<void> storage, void* data, DType dtype, TensorShape shape, Device device) {
  Tensor t = view(data, dtype, shape, device);
  t.storage_ = std::move(storage);
  return t;
}

Tensor Tensor::host(DType dtype, TensorShape shape) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  // calloc: zeroed, and large buffers come straight from the kernel's zero pages.
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) fail(ErrorCode::kOutOfMemory, "could not allocate ", bytes, " bytes of host memory");
  std::shared_ptr<void> storage(p, [](void* q) { std::free(q); });
  return owning(std::move(storage), p, dtype, shape);
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  SHARDLM_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= dim(0), "rows [", begin, ", ", end, ") of ",
                describe());
  std::vector<int64_t> dims = shape_.to_vector();
  const size_t row_bytes = dims[0] ? nbytes() / static_cast<size_t>(dims[0]) : 0;
  dims[0] = end - begin;
  Tensor t = *this;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin) * row_bytes;
  t.shape_ = TensorShape(dims);
  return t;
}

Tensor Tensor::reshape(TensorShape shape) const {
  SHARDLM_CHECK(shape.numel() == numel(), "reshape of ", describe(), " to ", shape.to_string());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

std::string Tensor::describe() const {
  std::string name = dtype_safetensors_name(dtype_);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name + shape_.to_string() + " on " + device_.to_string();
}

void Tensor::check_element_size(size_t size) const {
  SHARDLM_CHECK(size == dtype_size(dtype_), "element of ", size, " bytes requested from ", describe());
}

}  // namespace shardlm
