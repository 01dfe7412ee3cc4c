// Strict safetensors parsing: every malformed file gives a problem naming the
// file, the tensor and the numbers. Expected strings are written by hand.
#include "loader/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "test_files.h"

namespace shardlm {
namespace {

using testing::make_raw;

// Three tensors, 40 data bytes; the header (170 bytes of JSON) is padded to
// 256 bytes, so the data section starts at byte 264 and the file has 304 bytes.
constexpr const char* kHeader =
    R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
    R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
    R"("c":{"dtype":"F16","shape":[2,2],"data_offsets":[32,40]}})";

std::vector<uint8_t> base_data(size_t n = 40) {
  std::vector<uint8_t> data(std::max<size_t>(n, 40));
  for (int i = 0; i < 6; ++i) {
    float v = static_cast<float>(i);
    std::memcpy(data.data() + 4 * i, &v, 4);
  }
  for (int i = 0; i < 4; ++i) {
    data[24 + 2 * i] = 0x80;  // bf16 1.0 = 0x3f80, little-endian
    data[25 + 2 * i] = 0x3f;
    data[32 + 2 * i] = 0x00;  // f16 2.0 = 0x4000
    data[33 + 2 * i] = 0x40;
  }
  data.resize(n);
  return data;
}

std::vector<uint8_t> base_file() { return make_raw(kHeader, base_data(), 256); }

SafetensorsHeader parse(const std::vector<uint8_t>& bytes) {
  return parse_safetensors_header(bytes, "model.safetensors");
}

// Asserts there is exactly one problem and returns it.
Problem only_problem(const SafetensorsHeader& header) {
  EXPECT_EQ(header.problems.size(), 1u);
  for (const Problem& p : header.problems) std::cerr << "  problem: " << p.text() << "\n";
  return header.problems.empty() ? Problem{} : header.problems[0];
}

std::string header_with(const std::string& a_entry) {
  return R"({"a":)" + a_entry + R"(,"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)" +
         R"("c":{"dtype":"F16","shape":[2,2],"data_offsets":[32,40]}})";
}

TEST(Safetensors, ValidFileParsesWithoutProblems) {
  std::vector<uint8_t> file = base_file();
  ASSERT_EQ(file.size(), 304u);
  SafetensorsHeader h = parse(file);
  EXPECT_TRUE(h.problems.empty());
  EXPECT_TRUE(h.ok());
  EXPECT_EQ(h.header_size, 256u);
  EXPECT_EQ(h.data_start, 264u);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.tensors[1].name, "b");
  EXPECT_EQ(h.tensors[1].dtype, DType::kBF16);
  EXPECT_EQ(h.tensors[2].dtype, DType::kF16);
  EXPECT_EQ(h.tensors[2].begin, 32u);
  EXPECT_EQ(h.tensors[2].end, 40u);
  for (const auto& e : h.tensors) EXPECT_TRUE(e.usable) << e.name;
}

TEST(Safetensors, OpenMapsTensorsWithoutCopying) {
  auto dir = testing::fresh_dir("open_maps");
  testing::write_bytes(dir / "model.safetensors", base_file());
  SafetensorsFile file = SafetensorsFile::open(dir / "model.safetensors");
  EXPECT_EQ(file.name(), "model.safetensors");
  EXPECT_EQ(file.file_size(), 304u);
  EXPECT_EQ(file.tensor_bytes(), 40u);
  const TensorView& a = file.at("a");
  EXPECT_EQ(a.dtype, DType::kF32);
  EXPECT_EQ(a.n_elements(), 6);
  EXPECT_EQ(a.n_bytes, 24u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(load_as_f32(a.data, a.dtype, i), static_cast<float>(i));
  const TensorView& b = file.at("b");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(load_as_f32(b.data, b.dtype, i), 1.0f);
  const TensorView& c = file.at("c");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(load_as_f32(c.data, c.dtype, i), 2.0f);
  // b starts 24 bytes after a in the mapping.
  EXPECT_EQ(static_cast<const uint8_t*>(b.data) - static_cast<const uint8_t*>(a.data), 24);
  EXPECT_EQ(file.find("zzz"), nullptr);
  try {
    (void)file.at("zzz");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_STREQ(e.what(), "model.safetensors: no tensor named zzz");
  }
  // Moving the file object keeps the views valid (the mapping does not move).
  const void* before = a.data;
  SafetensorsFile moved = std::move(file);
  EXPECT_EQ(moved.at("a").data, before);
  EXPECT_EQ(load_as_f32(moved.at("a").data, DType::kF32, 5), 5.0f);
}

TEST(Safetensors, MetadataIsReadAndMustBeStrings) {
  std::string header = R"({"__metadata__":{"format":"pt"},)" + std::string(kHeader + 1);
  SafetensorsHeader h = parse(make_raw(header, base_data(), 256));
  EXPECT_TRUE(h.problems.empty());
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.tensors.size(), 3u);

  header = R"({"__metadata__":{"format":1},)" + std::string(kHeader + 1);
  Problem p = only_problem(parse(make_raw(header, base_data(), 256)));
  EXPECT_EQ(p.message, "__metadata__ key \"format\" is a number, expected a string");
}

TEST(Safetensors, ShorterThanEightBytes) {
  std::vector<uint8_t> bytes = {1, 2, 3, 4, 5};
  Problem p = only_problem(parse(bytes));
  EXPECT_EQ(p.file, "model.safetensors");
  EXPECT_EQ(p.severity, Severity::kError);
  EXPECT_EQ(p.message,
            "only 5 bytes — a safetensors file starts with an 8-byte header length; the download was cut");
  EXPECT_EQ(p.fix, "download this file again");
  EXPECT_EQ(only_problem(parse({})).message.substr(0, 12), "only 0 bytes");
}

TEST(Safetensors, FlippedHighByteOfHeaderLengthIsAbsurd) {
  std::vector<uint8_t> file = base_file();
  file[7] ^= 0x40;  // 256 + 0x40 << 56 = 4611686018427388160
  Problem p = only_problem(parse(file));
  EXPECT_EQ(p.message,
            "the header length field says 4611686018427388160 bytes, more than the 100,000,000-byte limit — "
            "the file is corrupt or not a safetensors file");
  EXPECT_EQ(p.text(),
            "model.safetensors: the header length field says 4611686018427388160 bytes, more than the "
            "100,000,000-byte limit — the file is corrupt or not a safetensors file; download this file again");
}

TEST(Safetensors, HeaderLengthPastTheEndOfTheFile) {
  std::vector<uint8_t> file = base_file();
  ASSERT_EQ(file[1], 0x01);  // 256 = 0x100
  file[1] = 0x04;  // 0x400 = 1024 bytes of header, but 304 - 8 = 296 follow
  Problem p = only_problem(parse(file));
  EXPECT_EQ(p.message,
            "the header length field says 1,024 bytes but only 296 bytes follow it — the file is cut short or "
            "corrupt");
}

TEST(Safetensors, FlippedByteInHeaderJsonIsInvalidJson) {
  std::vector<uint8_t> file = base_file();
  ASSERT_EQ(file[8 + 7], 'd');  // {"a":{"dtype"...: byte 7 of the header is the d of dtype
  file[8 + 6] = 0xff;           // the quote before dtype
  Problem p = only_problem(parse(file));
  EXPECT_EQ(p.message.rfind("the header is not valid JSON (at byte 7 of 256: ", 0), 0u) << p.message;
  EXPECT_EQ(p.fix, "the file is corrupt; download it again");
}

TEST(Safetensors, HeaderMustBeAnObject) {
  Problem p = only_problem(parse(make_raw("[1,2]", {})));
  EXPECT_EQ(p.message,
            "the header is an array, expected a JSON object mapping tensor names to {dtype, shape, data_offsets}");
}

TEST(Safetensors, EntryMustBeAnObject) {
  Problem p = only_problem(parse(make_raw(header_with("7"), base_data(), 256)));
  EXPECT_EQ(p.tensor, "a");
  EXPECT_EQ(p.message, "header entry for tensor a is a number, expected an object with dtype, shape and data_offsets");
}

TEST(Safetensors, UnknownDtypeIsNamed) {
  Problem p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"Q9","shape":[2,3],"data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.tensor, "a");
  EXPECT_EQ(p.code, ErrorCode::kCorruptFile);
  EXPECT_EQ(p.message, "tensor a has dtype \"Q9\", which is not a safetensors dtype");
}

TEST(Safetensors, UnsupportedDtypesAreNamed) {
  // I64 [3] = 24 bytes: the layout is right, only the dtype is refused.
  Problem p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"I64","shape":[3],"data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.code, ErrorCode::kUnsupported);
  EXPECT_EQ(p.tensor, "a");
  EXPECT_EQ(p.message,
            "tensor a has dtype I64, which shardlm does not support (supported: F32, F16, BF16, F8_E4M3, I32, I8, U8)");
  // F8_E5M2 [4, 6] = 24 bytes.
  p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"F8_E5M2","shape":[4,6],"data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.message,
            "tensor a has dtype F8_E5M2, which shardlm does not support (supported: F32, F16, BF16, F8_E4M3, I32, I8, U8)");
}

TEST(Safetensors, QuantizedStorageDtypesAreRead) {
  // F8_E4M3 [4, 6] = 24 bytes, I32 [6] = 24 bytes, I8 / U8 [24] = 24 bytes.
  for (const auto& [name, shape, dtype] :
       {std::tuple{"F8_E4M3", "[4,6]", DType::kF8E4M3}, std::tuple{"I32", "[6]", DType::kI32},
        std::tuple{"I8", "[24]", DType::kI8}, std::tuple{"U8", "[24]", DType::kU8}}) {
    SafetensorsHeader h = parse(make_raw(
        header_with(std::string(R"({"dtype":")") + name + R"(","shape":)" + shape + R"(,"data_offsets":[0,24]})"),
        base_data(), 256));
    EXPECT_TRUE(h.ok()) << name;
    ASSERT_EQ(h.tensors.size(), 1u) << name;
    EXPECT_TRUE(h.tensors[0].usable) << name;
    EXPECT_EQ(h.tensors[0].dtype, dtype) << name;
  }
}

TEST(Safetensors, ShapeMustBeNonNegativeIntegers) {
  Problem p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.tensor, "a");
  EXPECT_EQ(p.message, "tensor a: shape must be a list of non-negative integers, found [2,-3]");
  p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"F32","shape":[2,3.5],"data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.message, "tensor a: shape must be a list of non-negative integers, found [2,3.5]");
  p = only_problem(parse(make_raw(header_with(R"({"dtype":"F32","data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.message, "tensor a has no \"shape\"");
}

TEST(Safetensors, DataOffsetsMustBeOrderedPair) {
  Problem p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"F32","shape":[2,3],"data_offsets":[24,0]})"), base_data(), 256)));
  EXPECT_EQ(p.message, "tensor a: data_offsets must be [begin, end] with 0 <= begin <= end, found [24,0]");
  p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,24,48]})"), base_data(), 256)));
  EXPECT_EQ(p.message, "tensor a: data_offsets must be [begin, end] with 0 <= begin <= end, found [0,24,48]");
}

TEST(Safetensors, ByteCountMustMatchShapeAndDtype) {
  // [2, 4] F32 = 32 bytes, offsets say 24. Nothing else is wrong: 24 bytes are still covered.
  Problem p = only_problem(
      parse(make_raw(header_with(R"({"dtype":"F32","shape":[2,4],"data_offsets":[0,24]})"), base_data(), 256)));
  EXPECT_EQ(p.tensor, "a");
  EXPECT_EQ(p.message, "tensor a has shape [2, 4] and dtype F32, so 32 bytes, but data_offsets [0, 24] span 24 bytes");
}

TEST(Safetensors, TruncatedFileSaysHowMuchArrived) {
  std::vector<uint8_t> file = base_file();
  file.resize(300);  // b [24, 32) needs 264 + 32 = 296 bytes, c [32, 40) 304
  SafetensorsHeader h = parse(file);
  Problem p = only_problem(h);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(p.tensor, "c");
  EXPECT_EQ(p.message,
            "300 of 304 bytes — the download was cut (1 tensor ends past the end of the file, the first is c)");
  EXPECT_EQ(p.text(),
            "model.safetensors: 300 of 304 bytes — the download was cut (1 tensor ends past the end of the file, "
            "the first is c); download this file again");
  EXPECT_TRUE(h.tensors[0].usable);
  EXPECT_FALSE(h.tensors[2].usable);
}

TEST(Safetensors, TruncatedLargeFileUsesCommas) {
  // w: BF16 [512, 512] = 524,288 bytes; file = 8 + 128 + 524,288 = 524,424 bytes.
  std::string header = R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("w":{"dtype":"BF16","shape":[512,512],"data_offsets":[8,524296]}})";
  std::vector<uint8_t> file = make_raw(header, std::vector<uint8_t>(524296), 128);
  ASSERT_EQ(file.size(), 524432u);
  EXPECT_TRUE(parse(file).problems.empty());
  file.resize(100000);
  Problem p = only_problem(parse(file));
  EXPECT_EQ(p.message,
            "100,000 of 524,432 bytes — the download was cut (1 tensor ends past the end of the file, the first "
            "is w)");
  // Cut inside the header itself.
  file.resize(100);
  p = only_problem(parse(file));
  EXPECT_EQ(p.message, "the header length field says 128 bytes but only 92 bytes follow it — the file is cut short or corrupt");
}

TEST(Safetensors, OffsetsPastTheEndCountEveryTensor) {
  // 28 data bytes: b [24, 32) needs 296 bytes, c [32, 40) 304.
  Problem p = only_problem(parse(make_raw(kHeader, base_data(28), 256)));
  EXPECT_EQ(p.tensor, "b");
  EXPECT_EQ(p.message,
            "292 of 304 bytes — the download was cut (2 tensors end past the end of the file, the first is b)");
}

TEST(Safetensors, OverlappingTensors) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]},)"
                       R"("c":{"dtype":"F16","shape":[2,2],"data_offsets":[24,32]}})";
  Problem p = only_problem(parse(make_raw(header, base_data(32), 256)));
  EXPECT_EQ(p.tensor, "b");
  EXPECT_EQ(p.severity, Severity::kError);
  EXPECT_EQ(p.message, "tensors a [0, 24) and b [16, 24) overlap");
}

TEST(Safetensors, HoleIsAWarningAndLoadingAcceptsIt) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[28,36]},)"
                       R"("c":{"dtype":"F16","shape":[2,2],"data_offsets":[36,44]}})";
  std::vector<uint8_t> file = make_raw(header, base_data(44), 256);
  Problem p = only_problem(parse(file));
  EXPECT_EQ(p.severity, Severity::kWarning);
  EXPECT_EQ(p.tensor, "b");
  EXPECT_EQ(p.message, "bytes [24, 28) of the data section (4 bytes) belong to no tensor (between a and b)");

  auto dir = testing::fresh_dir("hole");
  testing::write_bytes(dir / "model.safetensors", file);
  SafetensorsFile f = SafetensorsFile::open(dir / "model.safetensors");
  EXPECT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.header().problems.size(), 1u);
}

TEST(Safetensors, BytesAfterTheLastTensorAreAWarning) {
  std::vector<uint8_t> file = make_raw(kHeader, base_data(48), 256);
  Problem p = only_problem(parse(file));
  EXPECT_EQ(p.severity, Severity::kWarning);
  EXPECT_EQ(p.tensor, "");
  EXPECT_EQ(p.message, "the last tensor ends at byte 304 but the file has 312 bytes (8 bytes belong to no tensor)");
}

TEST(Safetensors, DuplicateNamesAreReported) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})";
  SafetensorsHeader h = parse(make_raw(header, base_data(24), 256));
  ASSERT_FALSE(h.problems.empty());
  EXPECT_EQ(h.problems[0].tensor, "a");
  EXPECT_EQ(h.problems[0].message, "\"a\" appears more than once in the header");
}

TEST(Safetensors, AllProblemsAreCollected) {
  std::string header = R"({"a":{"dtype":"Q9","shape":[2,3],"data_offsets":[0,24]},)"
                       R"("b":{"dtype":"BF16","shape":[-4],"data_offsets":[24,32]},)"
                       R"("c":{"dtype":"F16","shape":[2,2],"data_offsets":[32,48]}})";
  SafetensorsHeader h = parse(make_raw(header, base_data(), 256));
  ASSERT_EQ(h.problems.size(), 4u);
  EXPECT_EQ(h.problems[0].tensor, "a");
  EXPECT_EQ(h.problems[1].tensor, "b");
  EXPECT_EQ(h.problems[2].message,
            "tensor c has shape [2, 2] and dtype F16, so 8 bytes, but data_offsets [32, 48] span 16 bytes");
  // b's bad shape hides its place in the layout, so no gap is reported for it.
  EXPECT_EQ(h.problems[3].message,
            "304 of 312 bytes — the download was cut (1 tensor ends past the end of the file, the first is c)");
}

TEST(Safetensors, OpenThrowsTheFirstErrorAndCountsTheRest) {
  auto dir = testing::fresh_dir("open_throws");
  std::vector<uint8_t> file = base_file();
  file.resize(290);  // a [0, 24) needs 288 bytes, b [24, 32) 296
  testing::write_bytes(dir / "model-00001-of-00002.safetensors", file);
  try {
    (void)SafetensorsFile::open(dir / "model-00001-of-00002.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptFile);
    EXPECT_STREQ(e.what(),
                 "model-00001-of-00002.safetensors: 290 of 304 bytes — the download was cut (2 tensors end past "
                 "the end of the file, the first is b); download this file again");
  }
  // inspect() does not throw and keeps the tensors that are whole.
  SafetensorsFile f = SafetensorsFile::inspect(dir / "model-00001-of-00002.safetensors");
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].name, "a");
  try {
    (void)SafetensorsFile::open(dir / "missing.safetensors");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(Slicing, RowsAreContiguousViews) {
  auto dir = testing::fresh_dir("slice_rows");
  testing::write_bytes(dir / "m.safetensors",
                       testing::make_safetensors({testing::f32_tensor("w", {4, 3}), testing::f32_tensor("bias", {5}, 10)}));
  SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  const TensorView& w = f.at("w");  // rows: [0 1 2] [3 4 5] [6 7 8] [9 10 11]
  EXPECT_EQ(w.row_bytes(), 12u);
  TensorView rows = slice_rows(w, 1, 3);
  EXPECT_EQ(rows.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(rows.n_bytes, 24u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(load_as_f32(rows.data, DType::kF32, i), 3.0f + i);
  TensorView bias = slice_rows(f.at("bias"), 2, 5);
  EXPECT_EQ(bias.shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(load_as_f32(bias.data, DType::kF32, 0), 12.0f);
  EXPECT_EQ(slice_rows(w, 4, 4).n_bytes, 0u);
  try {
    (void)slice_rows(w, 2, 5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor w [4, 3]: rows [2, 5) are outside [0, 4)");
  }
}

TEST(Slicing, ColumnsAreCopiedOut) {
  auto dir = testing::fresh_dir("slice_cols");
  testing::write_bytes(dir / "m.safetensors", testing::make_safetensors({testing::f32_tensor("w", {3, 4})}));
  SafetensorsFile f = SafetensorsFile::open(dir / "m.safetensors");
  const TensorView& w = f.at("w");  // rows: [0 1 2 3] [4 5 6 7] [8 9 10 11]
  std::vector<float> cols(6);
  copy_columns(w, 1, 3, cols.data());
  EXPECT_EQ(cols, (std::vector<float>{1, 2, 5, 6, 9, 10}));
  std::vector<float> block(2);
  copy_block(w, 1, 3, 3, 4, block.data());
  EXPECT_EQ(block, (std::vector<float>{7, 11}));
  try {
    copy_columns(w, 2, 5, cols.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "tensor w [3, 4]: block rows [0, 3) x columns [2, 5) is outside it");
  }
}

}  // namespace
}  // namespace shardlm
