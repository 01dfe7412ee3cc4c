#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "loader/model_spec.h"

namespace shardlm {
namespace {

int64_t total_bytes(const ModelSpec& spec, bool include_optional) {
  int64_t n = 0;
  for (const auto& t : expected_tensors(spec))
    if (!t.optional || include_optional) n += shape_numel(t.shape) * static_cast<int64_t>(dtype_size(spec.dtype));
  return n;
}

// The official safetensors index totals (metadata.total_size) are the ground
// truth for the tensor inventory of each family.
TEST(ModelSpec, TensorInventoryMatchesOfficialIndexTotals) {
  int checked = 0;
  for (const auto& m : model_catalog()) {
    if (m.hf_total_size_bytes < 0) continue;
    ModelSpec spec = catalog_model_spec(m.name);
    // Qwen3-0.6B ships lm_head although tied (see shared/model-configs/README.md).
    bool with_optional = std::string(m.name) == "qwen3-0.6b";
    EXPECT_EQ(total_bytes(spec, with_optional), m.hf_total_size_bytes) << m.name;
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

TEST(ModelSpec, SeedFactsHold) {
  ModelSpec q72 = catalog_model_spec("qwen2.5-72b");
  EXPECT_EQ(q72.n_heads, 64);
  EXPECT_EQ(q72.n_kv_heads, 8);
  EXPECT_EQ(total_bytes(q72, false), 145412407296);  // "about 145 GB"
  ModelSpec q32 = catalog_model_spec("Qwen/Qwen2.5-32B-Instruct");
  EXPECT_EQ(q32.n_heads, 40);  // not 64
  ModelSpec q7 = catalog_model_spec("qwen2.5-7b");
  EXPECT_EQ(q7.n_heads, 28);
  EXPECT_EQ(q7.n_kv_heads, 4);
  EXPECT_TRUE(q7.qkv_bias);
  ModelSpec l8 = catalog_model_spec("llama-3.1-8b");
  EXPECT_EQ(l8.rope_scaling.type, "llama3");
  EXPECT_EQ(l8.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  ModelSpec q3 = catalog_model_spec("qwen3-8b");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_dim, 128);
}

TEST(ModelSpec, UnknownCatalogNameListsTheCatalog) {
  try {
    catalog_model_spec("qwen9-1t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("qwen2.5-7b"), std::string::npos);
  }
}

TEST(ModelSpec, RejectsBadConfigsNamingTheField) {
  auto config = nlohmann::json::parse(find_catalog_model("qwen2.5-0.5b")->config_json);
  auto expect_error = [](const nlohmann::json& c, ErrorCode code, const std::string& needle) {
    try {
      parse_model_config(c, "config.json");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c1 = config;
  c1["architectures"] = {"GPT2LMHeadModel"};
  expect_error(c1, ErrorCode::kUnsupported, "GPT2LMHeadModel");
  auto c2 = config;
  c2.erase("hidden_size");
  expect_error(c2, ErrorCode::kInvalidArgument, "\"hidden_size\" is missing");
  auto c3 = config;
  c3["num_key_value_heads"] = 3;
  expect_error(c3, ErrorCode::kInvalidArgument, "num_key_value_heads (3)");
  auto c4 = config;
  c4["torch_dtype"] = "int8";
  expect_error(c4, ErrorCode::kUnsupported, "int8");
}

TEST(ModelSpec, ConfigJsonRoundTrips) {
  for (const auto& m : model_catalog()) {
    ModelSpec a = catalog_model_spec(m.name);
    ModelSpec b = parse_model_config(model_config_json(a), "roundtrip");
    EXPECT_EQ(expected_tensors(a).size(), expected_tensors(b).size()) << m.name;
    EXPECT_EQ(a.head_dim, b.head_dim);
    EXPECT_EQ(a.qkv_bias, b.qkv_bias) << m.name;
    EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
    EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  }
}

}  // namespace
}  // namespace shardlm
