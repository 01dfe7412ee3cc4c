#include "core/tensor.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace shardlm {
namespace {

TEST(Tensor, ViewsShareStorageAndKeepItAlive) {
  Tensor rows;
  {
    Tensor t = Tensor::host(DType::kBF16, {4, 3});
    EXPECT_TRUE(t.owns_storage());
    EXPECT_EQ(t.nbytes(), 24u);
    t.ptr<uint16_t>()[3 * 2] = 7;  // row 2, column 0
    rows = t.slice_rows(2, 4);
  }
  EXPECT_EQ(rows.shape(), (TensorShape{2, 3}));
  EXPECT_EQ(rows.ptr<uint16_t>()[0], 7);
  EXPECT_EQ(rows.reshape({6}).numel(), 6);
  EXPECT_EQ(rows.describe(), "bf16[2, 3] on cpu");
}

TEST(Tensor, ShapeAndTypeMistakesAreCaught) {
  Tensor t = Tensor::host(DType::kF32, {2, 5});
  EXPECT_THROW(t.reshape({3, 3}), Error);
  EXPECT_THROW(t.slice_rows(1, 3), Error);
  EXPECT_THROW(t.ptr<uint16_t>(), Error);
  EXPECT_THROW(TensorShape({1, 2, 3, 4, 5}), Error);
  int x = 0;
  Tensor v = Tensor::view(&x, DType::kF32, {1}, Device{DeviceKind::kCuda, 1});
  EXPECT_FALSE(v.owns_storage());
  EXPECT_EQ(v.device().to_string(), "cuda:1");
}

}  // namespace
}  // namespace shardlm
