// make-model's library side: the safetensors writer, the sharded writer and
// the synthetic checkpoint/tokenizer generators. Headers are parsed here with
// nlohmann::json directly, not with the loader's reader.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_spec.h"
#include "loader/safetensors_writer.h"
#include "loader/synthetic_checkpoint.h"
#include "loader/synthetic_tokenizer.h"

namespace shardlm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path temp_dir(const std::string& name) {
  const char* bin = std::getenv("SHARDLM_BINARY_DIR");
  fs::path dir = fs::path(bin ? bin : "/tmp") / "synthetic_checkpoint_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct Parsed {
  json header;
  std::string data;  // the data section
};

Parsed parse(const fs::path& p) {
  const std::string bytes = read_file(p);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  return {json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

TEST(SafetensorsWriter, HeaderOrderPaddingAndMetadata) {
  std::vector<TensorToWrite> t = {{"b", DType::kBF16, {3}}, {"a", DType::kBF16, {2, 2}}, {"z", DType::kF32, {1}}};
  std::vector<size_t> order;
  const std::string h = safetensors_header(t, &order);
  EXPECT_EQ(h.size() % 8, 0u);
  EXPECT_EQ(order, (std::vector<size_t>{2, 1, 0}));  // F32 first (larger alignment), then by name
  EXPECT_EQ(h.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"z\":", 0), 0u) << h;
  const json j = json::parse(h);
  EXPECT_EQ(j["z"]["data_offsets"], json::array({0, 4}));
  EXPECT_EQ(j["a"]["data_offsets"], json::array({4, 12}));
  EXPECT_EQ(j["b"]["data_offsets"], json::array({12, 18}));
  EXPECT_EQ(j["a"]["dtype"], "BF16");
  EXPECT_THROW(safetensors_header({{"a", DType::kF32, {1}}, {"a", DType::kF32, {2}}}), Error);
  EXPECT_THROW(safetensors_header({{"x", DType::kF32, {-1}}}), Error);
}

TEST(SafetensorsWriter, BytesRoundTrip) {
  const fs::path dir = temp_dir("roundtrip");
  std::vector<float> a = {1.5f, -2.0f, 3.25f};
  std::vector<uint16_t> b = {f32_to_bf16(0.5f), f32_to_bf16(-7.0f)};
  write_safetensors(dir / "x.safetensors", {{"a", DType::kF32, {3}}, {"b", DType::kBF16, {1, 2}}}, {a.data(), b.data()});
  const Parsed p = parse(dir / "x.safetensors");
  EXPECT_EQ(p.header["b"]["shape"], json::array({1, 2}));
  ASSERT_EQ(p.data.size(), 3 * 4 + 2 * 2u);
  EXPECT_EQ(std::memcmp(p.data.data(), a.data(), 12), 0);
  EXPECT_EQ(std::memcmp(p.data.data() + 12, b.data(), 4), 0);
  EXPECT_THROW(write_safetensors("/nonexistent-dir/x.safetensors", {{"a", DType::kF32, {3}}}, {a.data()}), Error);
}

TEST(SafetensorsWriter, ShardsAndIndex) {
  const fs::path dir = temp_dir("shards");
  std::vector<TensorToWrite> t;
  for (int i = 0; i < 7; ++i) t.push_back({"t" + std::to_string(i), DType::kF32, {10 * (i + 1)}});
  auto fill = [](const TensorToWrite& w, int64_t begin, int64_t count, void* out) {
    for (int64_t j = 0; j < count; ++j) static_cast<float*>(out)[j] = static_cast<float>(begin + j);
  };
  const ShardedWriteResult r = write_sharded_safetensors(dir, t, 3, fill);
  ASSERT_EQ(r.files.size(), 3u);
  EXPECT_EQ(r.files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(r.total_size, 4u * 10 * (1 + 2 + 3 + 4 + 5 + 6 + 7));
  const json index = json::parse(read_file(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], r.total_size);
  std::set<std::string> seen;
  uint64_t bytes = 0;
  for (const auto& f : r.files) {
    const Parsed p = parse(dir / f);
    int n = 0;
    for (const auto& [name, v] : p.header.items()) {
      if (name == "__metadata__") continue;
      ++n;
      EXPECT_TRUE(seen.insert(name).second);
      EXPECT_EQ(index["weight_map"][name], f);
    }
    EXPECT_GE(n, 1) << f;
    bytes += p.data.size();
  }
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_EQ(bytes, r.total_size);
  EXPECT_THROW(write_sharded_safetensors(dir, t, 0, fill), Error);
  EXPECT_THROW(write_sharded_safetensors(dir, t, 8, fill), Error);
}

TEST(SyntheticTokenizer, SizesAndErrors) {
  EXPECT_THROW(build_synthetic_tokenizer(258), Error);
  const SyntheticTokenizer smallest = build_synthetic_tokenizer(259);
  EXPECT_EQ(smallest.merges.size(), 0u);
  EXPECT_EQ(smallest.im_end_id, 258);
  const SyntheticTokenizer full = build_synthetic_tokenizer(152064);
  EXPECT_EQ(full.merges.size(), static_cast<size_t>(kSyntheticDefaultMerges));
  EXPECT_EQ(full.endoftext_id + 2, full.im_end_id);
  EXPECT_EQ(full.im_end_id + 1, full.n_vocab());
  std::set<std::string> unique(full.tokens.begin(), full.tokens.end());
  EXPECT_EQ(unique.size(), full.tokens.size());
  EXPECT_EQ(full.tokens[0], "!");
  EXPECT_EQ(byte_to_unicode(' '), "\xc4\xa0");  // Ġ
  const json j = synthetic_tokenizer_json(full);
  EXPECT_EQ(j["model"]["vocab"].size() + j["added_tokens"].size(), static_cast<size_t>(full.n_vocab()));
}

TEST(SyntheticCheckpoint, ConfigRoundTripAndStoredValues) {
  const fs::path dir = temp_dir("qwen3");
  SyntheticModelOptions o;
  o.like = "qwen3-0.6b";
  o.n_layers = 2;
  o.vocab_size = 300;
  o.hidden_size = 128;
  o.intermediate_size = 256;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.head_dim = 64;
  o.tie_word_embeddings = false;
  o.seed = 77;
  const SyntheticModelResult r = write_synthetic_model(dir, o);
  const ModelSpec s = load_model_config(dir / "config.json");
  EXPECT_EQ(s.family, Family::kQwen3);
  EXPECT_EQ(s.n_layers, 2);
  EXPECT_EQ(s.vocab_size, 300);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.q_dim(), 256);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_EQ(s.eos_token_ids, std::vector<int64_t>{r.tokenizer_vocab - 1});
  EXPECT_LE(r.tokenizer_vocab, 300);
  const Parsed p = parse(dir / "model.safetensors");
  for (const auto& t : expected_tensors(s)) {
    ASSERT_TRUE(p.header.contains(t.name)) << t.name;
    EXPECT_EQ(p.header[t.name]["shape"].get<std::vector<int64_t>>(), t.shape) << t.name;
    EXPECT_EQ(p.header[t.name]["dtype"], "BF16");
  }
  // Stored bytes are the documented generator's values rounded to bf16.
  for (const std::string name : {"model.layers.1.self_attn.k_norm.weight", "lm_head.weight", "model.layers.0.mlp.down_proj.weight"}) {
    const auto& e = p.header[name];
    const auto shape = e["shape"].get<std::vector<int64_t>>();
    const uint64_t begin = e["data_offsets"][0];
    for (int64_t i : {int64_t{0}, int64_t{1}, shape_numel(shape) - 1}) {
      uint16_t stored;
      std::memcpy(&stored, p.data.data() + begin + 2 * i, 2);
      EXPECT_EQ(stored, f32_to_bf16(synthetic_weight_value(77, name, 128, shape, false, i))) << name << "[" << i << "]";
    }
  }
  // Norm weights near 1, projections with std ~ 1/sqrt(in).
  EXPECT_NEAR(synthetic_weight_value(77, "model.norm.weight", 128, {128}, false, 5), 1.0f, 0.09f);
}

TEST(SyntheticCheckpoint, OutputRowsOfIdsWithoutATokenAreZero) {
  const fs::path dir = temp_dir("unused_rows");
  SyntheticModelOptions o;
  o.like = "qwen2.5-0.5b";  // tied: the embedding is the output projection
  o.n_layers = 1;
  o.vocab_size = 700;
  o.hidden_size = 64;
  o.n_heads = 2;
  o.n_kv_heads = 1;
  o.intermediate_size = 128;
  o.dtype = DType::kF32;
  const SyntheticModelResult r = write_synthetic_model(dir, o);
  ASSERT_LT(r.tokenizer_vocab, 700);
  const Parsed p = parse(dir / "model.safetensors");
  const uint64_t begin = p.header["model.embed_tokens.weight"]["data_offsets"][0];
  auto row_abs_sum = [&](int64_t row) {
    double sum = 0;
    for (int64_t c = 0; c < 64; ++c) {
      float v;
      std::memcpy(&v, p.data.data() + begin + 4 * (row * 64 + c), 4);
      sum += std::fabs(v);
    }
    return sum;
  };
  EXPECT_GT(row_abs_sum(r.tokenizer_vocab - 1), 0.5);
  EXPECT_EQ(row_abs_sum(r.tokenizer_vocab), 0.0);
  EXPECT_EQ(row_abs_sum(699), 0.0);
}

TEST(SyntheticCheckpoint, OptionErrorsNameTheOption) {
  auto message = [](SyntheticModelOptions o) -> std::string {
    try {
      synthetic_model_spec(o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  SyntheticModelOptions o;
  o.like = "qwen2.5-0.5b";
  EXPECT_EQ(message(o), "");
  o.vocab_size = 200;
  EXPECT_NE(message(o).find("--vocab"), std::string::npos);
  o.vocab_size = 0;
  o.n_heads = 7;
  o.n_kv_heads = 2;
  EXPECT_NE(message(o).find("--kv-heads"), std::string::npos);
  o.n_kv_heads = 7;
  o.head_dim = 63;
  EXPECT_NE(message(o).find("--head-dim"), std::string::npos);
  o = {};
  o.n_experts = 4;  // an MoE option on the dense default
  EXPECT_NE(message(o).find("--experts"), std::string::npos);
  o = {};
  o.like = "no-such-model";
  EXPECT_NE(message(o).find("qwen2.5-7b"), std::string::npos);
}

// MoE shapes: the catalog's routing, reduced where asked, and the expert
// tensors under the family's HF names.
TEST(SyntheticCheckpoint, MoeSpecsKeepRoutingAndTakeReductions) {
  SyntheticModelOptions o;
  o.like = "qwen3-235b-a22b";
  o.n_layers = 4;
  o.hidden_size = 256;
  o.n_heads = 8;
  o.n_kv_heads = 4;
  o.head_dim = 32;
  o.n_experts = 16;
  o.moe_intermediate_size = 64;
  o.decoder_sparse_step = 2;
  o.mlp_only_layers = std::vector<int64_t>{3};
  ModelSpec s = synthetic_model_spec(o);
  EXPECT_EQ(s.family, Family::kQwen3Moe);
  EXPECT_EQ(s.n_experts, 16);
  EXPECT_EQ(s.n_experts_per_token, 8);  // the catalog's top-8
  EXPECT_TRUE(s.norm_topk_prob);
  EXPECT_EQ(s.moe_intermediate_size, 64);
  std::vector<bool> sparse;
  for (int64_t l = 0; l < s.n_layers; ++l) sparse.push_back(s.is_moe_layer(l));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false}));
  int64_t experts = 0;
  for (const auto& t : synthetic_tensor_list(s)) {
    if (t.name == "model.layers.1.mlp.experts.15.down_proj.weight") EXPECT_EQ(t.shape, (std::vector<int64_t>{256, 64}));
    if (t.name == "model.layers.1.mlp.gate.weight") EXPECT_EQ(t.shape, (std::vector<int64_t>{16, 256}));
    experts += t.name.find(".experts.") != std::string::npos;
  }
  EXPECT_EQ(experts, 16 * 3);

  o = {};
  o.like = "mixtral-8x7b";
  o.n_layers = 1;
  o.hidden_size = 128;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.moe_intermediate_size = 96;  // Mixtral: the experts are intermediate_size wide
  s = synthetic_model_spec(o);
  EXPECT_EQ(s.intermediate_size, 96);
  EXPECT_EQ(s.moe_intermediate_size, 96);
  bool w2 = false;
  for (const auto& t : synthetic_tensor_list(s))
    if (t.name == "model.layers.0.block_sparse_moe.experts.7.w2.weight") {
      w2 = true;
      EXPECT_EQ(t.shape, (std::vector<int64_t>{128, 96}));
    }
  EXPECT_TRUE(w2);
  o.mlp_only_layers = std::vector<int64_t>{0};
  try {
    synthetic_model_spec(o);
    ADD_FAILURE() << "--mlp-only-layers accepted for Mixtral";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Qwen3-MoE"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
