// --device parsing and the rank → GPU rule (host-side, no GPU needed).
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>

#include "backend/device/device_choice.h"
#include "core/error.h"

namespace shardlm::backend {
namespace {

// The code of the Error f throws (nullopt when it throws none), its message in *what.
std::optional<ErrorCode> code_of(const std::function<void()>& f, std::string* what) {
  try {
    f();
  } catch (const Error& e) {
    *what = e.what();
    return e.code();
  }
  return std::nullopt;
}

TEST(DeviceFlag, ParsesCpuCudaAndCudaN) {
  EXPECT_TRUE(parse_device_flag("cpu").device.is_cpu());
  const DeviceFlag any = parse_device_flag("cuda");
  EXPECT_EQ(any.device, (Device{DeviceKind::kCuda, 0}));
  EXPECT_FALSE(any.index_given);
  const DeviceFlag three = parse_device_flag("cuda:3");
  EXPECT_EQ(three.device, (Device{DeviceKind::kCuda, 3}));
  EXPECT_TRUE(three.index_given);
}

TEST(DeviceFlag, RefusesOtherTextNamingTheFlag) {
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x", "CUDA", "cuda:0:1", ""}) {
    std::string what;
    EXPECT_EQ(code_of([&] { parse_device_flag(bad); }, &what), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(what.find("--device"), std::string::npos) << what;
    EXPECT_NE(what.find("cuda:N"), std::string::npos) << what;
  }
}

TEST(DeviceForRank, ProcessesTakeLocalRankModuloDevices) {
  RankPlacement p{parse_device_flag("cuda"), true, 0, 6, 6};
  for (int r = 0; r < 6; ++r) {
    p.local_rank = r;
    EXPECT_EQ(device_for_rank(p), (Device{DeviceKind::kCuda, r}));
  }
  // Two hosts of four GPUs, -np 8: local ranks 0..3 on each.
  p = {parse_device_flag("cuda"), true, 3, 4, 4};
  EXPECT_EQ(device_for_rank(p).index, 3);
  // One process under mpirun may name its GPU.
  p = {parse_device_flag("cuda:2"), true, 0, 1, 4};
  EXPECT_EQ(device_for_rank(p).index, 2);
}

TEST(DeviceForRank, MoreProcessesThanGpusOnAHostIsRefused) {
  std::string what;
  const RankPlacement p{parse_device_flag("cuda"), true, 6, 8, 6};
  EXPECT_EQ(code_of([&] { device_for_rank(p); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_NE(what.find("8 ranks on this host but it has 6 GPU(s)"), std::string::npos) << what;
  EXPECT_NE(what.find("one device per rank"), std::string::npos) << what;
}

TEST(DeviceForRank, ExplicitIndexWithSeveralProcessesIsRefused) {
  std::string what;
  const RankPlacement p{parse_device_flag("cuda:1"), true, 0, 2, 2};
  EXPECT_EQ(code_of([&] { device_for_rank(p); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_NE(what.find("every rank would take GPU 1"), std::string::npos) << what;
}

TEST(DeviceForRank, ThreadsShareTheNamedDevice) {
  RankPlacement p{parse_device_flag("cuda:1"), false, 0, 6, 2};
  for (int r = 0; r < 6; ++r) {
    p.local_rank = r;
    EXPECT_EQ(device_for_rank(p), (Device{DeviceKind::kCuda, 1}));
  }
  p.flag = parse_device_flag("cuda");
  EXPECT_EQ(device_for_rank(p).index, 0);
}

TEST(DeviceForRank, NoGpuOrAnIndexPastTheDevicesIsRefused) {
  std::string what;
  RankPlacement p{parse_device_flag("cuda"), false, 0, 1, 0};
  EXPECT_EQ(code_of([&] { device_for_rank(p); }, &what), ErrorCode::kUnsupported);
  EXPECT_NE(what.find("sees no CUDA device"), std::string::npos) << what;
  p = {parse_device_flag("cuda:4"), false, 0, 1, 2};
  EXPECT_EQ(code_of([&] { device_for_rank(p); }, &what), ErrorCode::kInvalidArgument);
  EXPECT_NE(what.find("cuda:0 to cuda:1"), std::string::npos) << what;
  // cpu never needs a GPU.
  p = {parse_device_flag("cpu"), true, 5, 8, 0};
  EXPECT_TRUE(device_for_rank(p).is_cpu());
}

}  // namespace
}  // namespace shardlm::backend
