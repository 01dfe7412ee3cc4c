#include "loader/safetensors_writer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

using nlohmann::json;

namespace {

// Bytes handed to the fill callback per call: large enough for throughput,
// small enough that a 1 GB tensor never needs a second copy.
constexpr uint64_t kChunkBytes = 16u << 20;

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};

}  // namespace

int64_t TensorToWrite::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t TensorToWrite::n_bytes() const { return static_cast<uint64_t>(n_elements()) * dtype_size(dtype); }

std::string safetensors_header(const std::vector<TensorToWrite>& tensors, std::vector<size_t>* data_order,
                               const std::map<std::string, std::string>& metadata) {
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty()) fail(ErrorCode::kInvalidArgument, "safetensors writer: a tensor has an empty name");
    if (t.name == "__metadata__") fail(ErrorCode::kInvalidArgument, "safetensors writer: \"__metadata__\" is reserved, not a tensor name");
    if (!names.insert(t.name).second) fail(ErrorCode::kInvalidArgument, "safetensors writer: tensor ", t.name, " is listed twice");
    for (int64_t d : t.shape)
      if (d < 0) fail(ErrorCode::kInvalidArgument, "safetensors writer: tensor ", t.name, " has a negative dimension ", d);
  }
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // safetensors' prepare(): alignment (dtype size) descending, then name.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    size_t sa = dtype_size(tensors[a].dtype), sb = dtype_size(tensors[b].dtype);
    if (sa != sb) return sa > sb;
    return tensors[a].name < tensors[b].name;
  });
  std::string out = "{";
  bool first = true;
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    out += "\"__metadata__\":" + m.dump();
    first = false;
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const auto& t = tensors[i];
    json e = {{"dtype", dtype_safetensors_name(t.dtype)},
              {"shape", t.shape},
              {"data_offsets", json::array({offset, offset + t.n_bytes()})}};
    offset += t.n_bytes();
    out += (first ? "" : ",") + json(t.name).dump() + ":" + e.dump();
    first = false;
  }
  out += "}";
  while (out.size() % 8 != 0) out += ' ';
  if (data_order) *data_order = std::move(order);
  return out;
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const TensorFill& fill) {
  std::vector<size_t> order;
  const std::string header = safetensors_header(tensors, &order);
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(path.c_str(), "wb"));
  if (!f) fail(ErrorCode::kIo, path.string(), ": cannot open for writing (does the directory exist and is it writable?)");
  auto put = [&](const void* data, size_t n) {
    if (n && std::fwrite(data, 1, n, f.get()) != n)
      fail(ErrorCode::kIo, path.string(), ": write failed after part of the file (disk full?)");
  };
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  put(len, 8);
  put(header.data(), header.size());
  std::vector<uint8_t> buffer;
  for (size_t i : order) {
    const auto& t = tensors[i];
    const int64_t numel = t.n_elements();
    const size_t esize = dtype_size(t.dtype);
    const int64_t per_chunk = static_cast<int64_t>(std::max<uint64_t>(1, kChunkBytes / esize));
    for (int64_t begin = 0; begin < numel; begin += per_chunk) {
      int64_t count = std::min(per_chunk, numel - begin);
      buffer.resize(static_cast<size_t>(count) * esize);
      fill(t, begin, count, buffer.data());
      put(buffer.data(), buffer.size());
    }
  }
  if (std::fflush(f.get()) != 0) fail(ErrorCode::kIo, path.string(), ": flush failed (disk full?)");
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0) fail(ErrorCode::kIo, path.string(), ": close failed (disk full?)");
}

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::vector<const void*>& data) {
  if (data.size() != tensors.size())
    fail(ErrorCode::kInvalidArgument, "safetensors writer: ", tensors.size(), " tensors but ", data.size(), " data pointers");
  std::map<std::string, const void*> by_name;
  for (size_t i = 0; i < tensors.size(); ++i) by_name[tensors[i].name] = data[i];
  write_safetensors(path, tensors, [&](const TensorToWrite& t, int64_t begin, int64_t count, void* out) {
    const size_t esize = dtype_size(t.dtype);
    std::memcpy(out, static_cast<const uint8_t*>(by_name.at(t.name)) + begin * esize, count * esize);
  });
}

std::string shard_file_name(int shard_index, int n_shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", shard_index + 1, n_shards);
  return buf;
}

ShardedWriteResult write_sharded_safetensors(const std::filesystem::path& dir,
                                             const std::vector<TensorToWrite>& tensors, int n_shards,
                                             const TensorFill& fill) {
  if (n_shards < 1) fail(ErrorCode::kInvalidArgument, "shards must be at least 1, found ", n_shards);
  if (static_cast<size_t>(n_shards) > tensors.size())
    fail(ErrorCode::kInvalidArgument, "shards (", n_shards, ") exceeds the number of tensors (", tensors.size(),
         "); every shard must hold at least one tensor");
  ShardedWriteResult result;
  for (const auto& t : tensors) result.total_size += t.n_bytes();
  if (n_shards == 1) {
    write_safetensors(dir / "model.safetensors", tensors, fill);
    result.files.push_back("model.safetensors");
    for (const auto& t : tensors) result.weight_map[t.name] = "model.safetensors";
    return result;
  }
  // Greedy split in the given order: close shard s once its bytes reach
  // (s+1)/n of the total, keeping enough tensors for the remaining shards.
  std::vector<std::vector<TensorToWrite>> groups(n_shards);
  uint64_t written = 0;
  size_t i = 0;
  for (int s = 0; s < n_shards; ++s) {
    const uint64_t target = result.total_size * static_cast<uint64_t>(s + 1) / static_cast<uint64_t>(n_shards);
    do {
      groups[s].push_back(tensors[i]);
      written += tensors[i].n_bytes();
      ++i;
    } while (i < tensors.size() && tensors.size() - i > static_cast<size_t>(n_shards - 1 - s) &&
             (s == n_shards - 1 || written + tensors[i].n_bytes() / 2 <= target));
  }
  for (int s = 0; s < n_shards; ++s) {
    const std::string name = shard_file_name(s, n_shards);
    write_safetensors(dir / name, groups[s], fill);
    result.files.push_back(name);
    for (const auto& t : groups[s]) result.weight_map[t.name] = name;
  }
  json index = {{"metadata", {{"total_size", result.total_size}}}, {"weight_map", json::object()}};
  for (const auto& [k, v] : result.weight_map) index["weight_map"][k] = v;
  const auto index_path = dir / "model.safetensors.index.json";
  std::ofstream out(index_path);
  out << index.dump(2) << "\n";
  if (!out) fail(ErrorCode::kIo, index_path.string(), ": cannot write");
  return result;
}

}  // namespace shardlm
