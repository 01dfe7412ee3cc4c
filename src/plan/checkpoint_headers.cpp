#include "plan/checkpoint_headers.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/bounded_json_file.h"
#include "core/error.h"

namespace shardlm {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // safetensors caps headers at 100 MB

int64_t safetensors_dtype_size(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return -1;
}

}  // namespace

CheckpointHeaders read_checkpoint_headers(const std::filesystem::path& dir) {
  CheckpointHeaders out;
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  bool first = true;
  for (const auto& path : files) {
    const std::string file = path.filename().string();
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::kIo, path.string(), ": cannot open for reading");
    const uint64_t file_size = std::filesystem::file_size(path, ec);
    unsigned char len_bytes[8];
    if (!in.read(reinterpret_cast<char*>(len_bytes), 8))
      fail(ErrorCode::kCorruptFile, path.string(), ": shorter than the 8-byte safetensors header length (", file_size,
           " bytes); the file is truncated — download it again");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n == 0 || n > kMaxHeaderBytes || n + 8 > file_size)
      fail(ErrorCode::kCorruptFile, path.string(), ": header length ", n, " does not fit the file of ", file_size,
           " bytes (expected 1..", kMaxHeaderBytes, " and at most file size - 8); the file is truncated or not safetensors");
    std::string text(n, '\0');
    if (!in.read(text.data(), static_cast<std::streamsize>(n)))
      fail(ErrorCode::kCorruptFile, path.string(), ": cannot read the ", n, "-byte header");
    nlohmann::json header;
    try {
      header = parse_json_file(std::string_view(text), path.string());
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorCode::kCorruptFile, path.string(), ": header is not valid JSON: ", e.what());
    }
    if (!header.is_object()) fail(ErrorCode::kCorruptFile, path.string(), ": header is not a JSON object");
    const uint64_t data_size = file_size - 8 - n;
    for (const auto& [name, t] : header.items()) {
      if (name == "__metadata__") continue;
      if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") ||
          !t["dtype"].is_string() || !t["shape"].is_array() || !t["data_offsets"].is_array() ||
          t["data_offsets"].size() != 2)
        fail(ErrorCode::kCorruptFile, path.string(), ": tensor ", name,
             ": header entry needs dtype (string), shape (array) and data_offsets ([begin, end])");
      HeaderTensor ht;
      ht.file = file;
      ht.dtype = t["dtype"].get<std::string>();
      int64_t numel = 1;
      for (const auto& d : t["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          fail(ErrorCode::kCorruptFile, path.string(), ": tensor ", name, ": shape ", t["shape"].dump(),
               " has a dimension that is not a non-negative integer");
        ht.shape.push_back(d.get<int64_t>());
        numel *= d.get<int64_t>();
      }
      const auto& off = t["data_offsets"];
      if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned() || off[1].get<uint64_t>() < off[0].get<uint64_t>() ||
          off[1].get<uint64_t>() > data_size)
        fail(ErrorCode::kCorruptFile, path.string(), ": tensor ", name, ": data_offsets ", off.dump(),
             " fall outside the ", data_size, " data bytes; the file is truncated or corrupt");
      ht.bytes = static_cast<int64_t>(off[1].get<uint64_t>() - off[0].get<uint64_t>());
      const int64_t esize = safetensors_dtype_size(ht.dtype);
      if (esize < 0)
        fail(ErrorCode::kCorruptFile, path.string(), ": tensor ", name, ": unknown dtype \"", ht.dtype, "\"");
      if (numel * esize != ht.bytes)
        fail(ErrorCode::kCorruptFile, path.string(), ": tensor ", name, ": ", ht.bytes, " bytes for ", ht.dtype,
             " ", shape_string(ht.shape), " (expected ", numel * esize, ")");
      if (first) out.dtype = ht.dtype;
      else if (out.dtype != ht.dtype) out.dtype.clear();
      first = false;
      out.total_bytes += ht.bytes;
      if (!out.tensors.emplace(name, ht).second)
        fail(ErrorCode::kCorruptFile, path.string(), ": tensor ", name, " is also in ", out.tensors[name].file,
             "; a checkpoint holds each tensor once");
    }
    ++out.n_files;
  }
  return out;
}

void check_headers_match_spec(const CheckpointHeaders& headers, const ModelSpec& spec) {
  for (const TensorSpec& t : expected_tensors(spec)) {
    auto it = headers.tensors.find(t.name);
    if (it == headers.tensors.end()) {
      if (t.optional) continue;
      fail(ErrorCode::kCorruptFile, "checkpoint: tensor ", t.name, " with shape ", shape_string(t.shape),
           " is missing from every .safetensors file (", headers.n_files,
           " files); config.json and the weights do not belong together, or a shard is missing");
    }
    const bool shape_ok = it->second.shape == t.shape || std::find(t.other_shapes.begin(), t.other_shapes.end(),
                                                                    it->second.shape) != t.other_shapes.end();
    if (!shape_ok && t.part != QuantPart::kNone)
      fail(ErrorCode::kCorruptFile, it->second.file, ": tensor ", t.name, " has shape ", shape_string(it->second.shape),
           " but ", spec.quant.source, " (", spec.quant.describe(), ") stores the [", t.out_features, ", ",
           t.in_features, "] Linear ", t.module, " with ", quant_part_name(t.part), " ", shape_string(t.shape));
    if (!shape_ok)
      fail(ErrorCode::kCorruptFile, it->second.file, ": tensor ", t.name, " has shape ", shape_string(it->second.shape),
           " but config.json implies ", shape_string(t.shape));
    if (!t.dtypes.empty()) {
      bool dtype_ok = false;
      std::string accepted;
      for (DType d : t.dtypes) {
        dtype_ok = dtype_ok || it->second.dtype == dtype_safetensors_name(d);
        accepted += (accepted.empty() ? "" : " or ") + std::string(dtype_safetensors_name(d));
      }
      if (!dtype_ok)
        fail(ErrorCode::kCorruptFile, it->second.file, ": tensor ", t.name, " is ", it->second.dtype, ", but ",
             quant_method_name(spec.quant.method), " stores ", quant_part_name(t.part), " as ", accepted);
    }
  }
}

}  // namespace shardlm
