#include "model/weight_source.h"

#include "core/error.h"
#include "loader/model_spec.h"

namespace shardlm {

void MemoryWeightSource::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                             std::vector<uint8_t> bytes) {
  const size_t want = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (bytes.size() != want)
    fail(ErrorCode::kInvalidArgument, "tensor ", name, " ", shape_string(shape), " ", dtype_safetensors_name(dtype),
         " needs ", want, " bytes, got ", bytes.size());
  auto e = std::make_unique<Entry>();
  e->bytes = std::move(bytes);
  e->ref = {name, dtype, std::move(shape), e->bytes.data()};
  tensors_[name] = std::move(e);
}

const WeightRef* MemoryWeightSource::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second->ref;
}

}  // namespace shardlm
