#include "test_files.h"

#include <nlohmann/json.hpp>

#include "loader/model_spec.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace shardlm::testing {

namespace {

uint16_t to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  return static_cast<uint16_t>(u >> 16);  // truncation is exact for the small values tests use
}

}  // namespace

std::vector<uint8_t> make_raw(std::string_view header_json, std::span<const uint8_t> data, size_t pad_to) {
  std::string header(header_json);
  if (pad_to > header.size()) header.append(pad_to - header.size(), ' ');
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> make_safetensors(const std::vector<RawTensor>& tensors, std::string_view metadata_json) {
  std::ostringstream header;
  header << "{";
  bool first = true;
  if (!metadata_json.empty()) {
    header << "\"__metadata__\":" << metadata_json;
    first = false;
  }
  std::vector<uint8_t> data;
  for (const RawTensor& t : tensors) {
    if (!first) header << ",";
    first = false;
    header << "\"" << t.name << "\":{\"dtype\":\"" << t.dtype << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header << (i ? "," : "") << t.shape[i];
    header << "],\"data_offsets\":[" << data.size() << "," << data.size() + t.data.size() << "]}";
    data.insert(data.end(), t.data.begin(), t.data.end());
  }
  header << "}";
  std::string text = header.str();
  return make_raw(text, data, (text.size() + 7) / 8 * 8);
}

RawTensor f32_tensor(std::string name, std::vector<int64_t> shape, float start) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  RawTensor t{std::move(name), "F32", std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n) * 4)};
  for (int64_t i = 0; i < n; ++i) {
    float v = start + static_cast<float>(i);
    std::memcpy(t.data.data() + i * 4, &v, 4);
  }
  return t;
}

RawTensor bf16_tensor(std::string name, std::vector<int64_t> shape, float value) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  RawTensor t{std::move(name), "BF16", std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n) * 2)};
  uint16_t bits = to_bf16(value);
  for (int64_t i = 0; i < n; ++i) std::memcpy(t.data.data() + i * 2, &bits, 2);
  return t;
}

void write_bytes(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void write_text(const std::filesystem::path& path, std::string_view text) {
  write_bytes(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

std::vector<uint8_t> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::filesystem::path fresh_dir(std::string_view name) {
  const char* build = std::getenv("SHARDLM_BINARY_DIR");
#ifdef SHARDLM_TEST_BINARY_DIR
  if (build == nullptr) build = SHARDLM_TEST_BINARY_DIR;
#endif
  std::filesystem::path root = build ? std::filesystem::path(build) / "test_tmp" / "loader"
                                     : std::filesystem::temp_directory_path() / "shardlm_test_loader";
  std::filesystem::path dir = root / std::string(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

const char* const kTinyConfig = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 128,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "eos_token_id": 2
})";

std::string shard_name(int i, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", i, n);
  return buf;
}

std::vector<std::vector<std::string>> write_tiny_model(const std::filesystem::path& dir,
                                                       const std::string& config_json,
                                                       const TinyModelOptions& options) {
  write_text(dir / "config.json", config_json);
  ModelSpec spec = parse_model_config(nlohmann::json::parse(config_json), "config.json");
  std::vector<RawTensor> tensors;
  for (const TensorSpec& t : expected_tensors(spec)) {
    if (t.optional || options.drop.count(t.name)) continue;
    std::vector<int64_t> shape = t.shape;
    if (auto it = options.reshape.find(t.name); it != options.reshape.end()) shape = it->second;
    tensors.push_back(options.f32.count(t.name) ? f32_tensor(t.name, shape) : bf16_tensor(t.name, shape));
  }
  for (const RawTensor& t : options.extra) tensors.push_back(t);
  const int n = options.n_shards;
  std::vector<std::vector<std::string>> names(n);
  nlohmann::json weight_map = nlohmann::json::object();
  size_t total = 0;
  for (int i = 0; i < n; ++i) {
    size_t lo = tensors.size() * i / n, hi = tensors.size() * (i + 1) / n;
    std::vector<RawTensor> shard(tensors.begin() + lo, tensors.begin() + hi);
    std::string file = n == 1 ? "model.safetensors" : shard_name(i + 1, n);
    for (RawTensor& t : shard) {
      names[i].push_back(t.name);
      weight_map[t.name] = file;
      total += t.data.size();
      if (auto it = options.rename.find(t.name); it != options.rename.end()) t.name = it->second;
    }
    write_bytes(dir / file, make_safetensors(shard));
  }
  if (n > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text(dir / "model.safetensors.index.json", index.dump(2));
  }
  if (options.tokenizer) {
    write_text(dir / "tokenizer.json", R"({"version":"1.0","model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}})");
    write_text(dir / "tokenizer_config.json", R"({"eos_token":"<|im_end|>","chat_template":"{{ messages }}"})");
  }
  return names;
}

std::string cli_path() {
  if (const char* cli = std::getenv("SHARDLM_CLI"); cli != nullptr && *cli != 0) return cli;
#ifdef SHARDLM_TEST_CLI
  return SHARDLM_TEST_CLI;
#else
  throw std::runtime_error("SHARDLM_CLI is not set");
#endif
}

}  // namespace shardlm::testing
