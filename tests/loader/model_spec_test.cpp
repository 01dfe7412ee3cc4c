#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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
  // Gemma 3 12B/27B: sparse text_configs over Gemma3TextConfig's defaults.
  ModelSpec g27 = catalog_model_spec("gemma-3-27b");
  EXPECT_EQ(g27.family, Family::kGemma3);
  EXPECT_EQ(g27.head_dim, 128);  // 32 x 128 = 4096 != hidden 5376
  EXPECT_EQ(g27.n_heads, 32);
  EXPECT_EQ(g27.n_kv_heads, 16);
  EXPECT_EQ(g27.query_pre_attn_scalar, 168.0);  // the only size whose scale is not head_dim's
  EXPECT_EQ(g27.vocab_size, 262208);
  EXPECT_EQ(g27.sliding_window, 1024);
  EXPECT_EQ(g27.rope_scaling.type, "linear");
  int64_t n_global = 0;
  for (int64_t l = 0; l < g27.n_layers; ++l) n_global += g27.is_sliding_layer(l) ? 0 : 1;
  EXPECT_EQ(g27.n_layers, 62);
  EXPECT_EQ(n_global, 10);  // layers 5, 11, ..., 59
  ModelSpec g12 = catalog_model_spec("gemma-3-12b");
  EXPECT_EQ(g12.head_dim, 256);
  EXPECT_EQ(g12.n_heads, 16);
  EXPECT_EQ(g12.n_kv_heads, 8);
  EXPECT_EQ(g12.hidden_size, 3840);
  EXPECT_EQ(g12.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(g12.tensor_prefix, "language_model.");
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

// Every catalog entry equals what parse_model_config makes of the full
// official config.json in shared/model-configs/ (where that folder exists:
// SHARDLM_MODEL_CONFIGS, default /work/shared/model-configs).
TEST(ModelSpec, CatalogEqualsTheOfficialConfigs) {
  const char* env = std::getenv("SHARDLM_MODEL_CONFIGS");
  const std::filesystem::path dir = env ? env : "/work/shared/model-configs";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is not here";
  int checked = 0;
  for (const auto& m : model_catalog()) {
    const auto file = dir / (std::string(m.hf_name) + ".json");
    if (!std::filesystem::exists(file)) continue;
    ModelSpec official = load_model_config(file);
    ModelSpec ours = catalog_model_spec(m.name);
    EXPECT_EQ(model_config_json(official).dump(), model_config_json(ours).dump()) << m.name;
    EXPECT_EQ(expected_tensors(official).size(), expected_tensors(ours).size()) << m.name;
    ++checked;
  }
  EXPECT_GE(checked, 18);
}

TEST(ModelSpec, MoeConfigsParseEveryRoutingField) {
  ModelSpec q30 = catalog_model_spec("qwen3-30b-a3b");
  EXPECT_EQ(q30.family, Family::kQwen3Moe);
  EXPECT_EQ(q30.n_experts, 128);
  EXPECT_EQ(q30.n_experts_per_token, 8);
  EXPECT_EQ(q30.moe_intermediate_size, 768);
  EXPECT_TRUE(q30.norm_topk_prob);
  EXPECT_EQ(q30.n_moe_layers(), 48);
  // 30,532,122,624 parameters: the bf16 bytes HF lists for Qwen3-30B-A3B-Instruct-2507 (same shapes).
  EXPECT_EQ(total_bytes(q30, false), 61064245248);
  ModelSpec mix = catalog_model_spec("mixtral-8x7b");
  EXPECT_EQ(mix.n_experts, 8);
  EXPECT_EQ(mix.n_experts_per_token, 2);
  EXPECT_EQ(mix.moe_intermediate_size, 14336);
  EXPECT_TRUE(mix.norm_topk_prob);
  EXPECT_EQ(total_bytes(mix, false), 2 * 46702792704LL);  // 46.7B parameters

  // decoder_sparse_step and mlp_only_layers make some layers dense.
  auto c = nlohmann::json::parse(find_catalog_model("qwen3-30b-a3b")->config_json);
  c["num_hidden_layers"] = 6;
  c["decoder_sparse_step"] = 2;
  c["mlp_only_layers"] = {3};
  c["norm_topk_prob"] = false;
  ModelSpec s = parse_model_config(c, "config.json");
  EXPECT_FALSE(s.norm_topk_prob);
  std::vector<bool> sparse;
  for (int64_t l = 0; l < s.n_layers; ++l) sparse.push_back(s.is_moe_layer(l));
  EXPECT_EQ(sparse, (std::vector<bool>{false, true, false, false, false, true}));
  int dense_mlps = 0, routers = 0;
  for (const auto& t : expected_tensors(s)) {
    if (t.name.find("mlp.gate_proj.weight") != std::string::npos && t.name.find("experts") == std::string::npos) {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{6144, 2048})) << t.name;  // intermediate_size, not moe_intermediate_size
      ++dense_mlps;
    }
    if (t.name.find("mlp.gate.weight") != std::string::npos) ++routers;
  }
  EXPECT_EQ(dense_mlps, 4);
  EXPECT_EQ(routers, 2);
  ModelSpec back = parse_model_config(model_config_json(s), "roundtrip");
  EXPECT_EQ(back.mlp_only_layers, s.mlp_only_layers);
  EXPECT_EQ(back.decoder_sparse_step, 2);
  EXPECT_FALSE(back.norm_topk_prob);
}

// A field shardlm would otherwise drop is refused by name.
TEST(ModelSpec, NoConfigIsSilentlyMisread) {
  auto expect_error = [](const nlohmann::json& c, const std::string& needle) {
    try {
      parse_model_config(c, "config.json");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto config = [](const char* name) { return nlohmann::json::parse(find_catalog_model(name)->config_json); };
  for (const char* name : {"llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b"}) {
    auto c = config(name);
    c["attention_bias"] = true;
    expect_error(c, "attention_bias=true");
  }
  for (const char* name : {"qwen2.5-7b", "qwen3-8b", "qwen3-30b-a3b"}) {
    auto c = config(name);
    c["use_sliding_window"] = true;
    expect_error(c, "use_sliding_window=true");
  }
  for (const char* name : {"mistral-7b", "mixtral-8x7b"}) {
    auto c = config(name);
    c["sliding_window"] = 4096;  // Mistral-7B v0.1: honoured on every layer
    const ModelSpec windowed = parse_model_config(c, "config.json");
    EXPECT_EQ(windowed.sliding_window, 4096) << name;
    EXPECT_EQ(windowed.sliding_layers, std::vector<bool>(static_cast<size_t>(windowed.n_layers), true)) << name;
    c["sliding_window"] = 32768;  // never binds below max_position_embeddings
    EXPECT_TRUE(parse_model_config(c, "config.json").sliding_layers.empty()) << name;
  }
  auto q = config("qwen3-30b-a3b");
  q["shared_expert_intermediate_size"] = 5632;
  expect_error(q, "shared_expert_intermediate_size");
  auto q2 = config("qwen3-30b-a3b");
  q2["output_router_logits"] = true;
  expect_error(q2, "output_router_logits");
  // Qwen2.5 ships sliding_window with use_sliding_window false: inert, accepted.
  auto q25 = config("qwen2.5-7b");
  q25["sliding_window"] = 131072;
  q25["use_sliding_window"] = false;
  EXPECT_NO_THROW(parse_model_config(q25, "config.json"));
  // Every MLP is SwiGLU: another activation is refused, naming the field.
  for (const char* name : {"qwen3-30b-a3b", "mixtral-8x7b", "qwen2.5-7b"}) {
    auto c = config(name);
    c["hidden_act"] = "gelu";
    expect_error(c, "hidden_act");
  }
  auto expect_invalid = [](const nlohmann::json& c, const std::string& needle) {
    try {
      parse_model_config(c, "config.json");
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  for (const char* field : {"num_experts", "num_experts_per_tok", "moe_intermediate_size"}) {
    auto c = config("qwen3-30b-a3b");
    c[field] = 0;
    expect_invalid(c, field);
    c.erase(field);
    expect_invalid(c, field);
  }
  auto top = config("mixtral-8x7b");
  top["num_experts_per_tok"] = 9;
  expect_invalid(top, "num_experts_per_tok");
  auto local = config("mixtral-8x7b");
  local.erase("num_local_experts");
  expect_invalid(local, "num_local_experts");
  auto step = config("qwen3-30b-a3b");
  step["decoder_sparse_step"] = 0;
  expect_invalid(step, "decoder_sparse_step");
  // Bad values name the field.
  auto q3 = config("qwen3-30b-a3b");
  q3["mlp_only_layers"] = {99};
  try {
    parse_model_config(q3, "config.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp_only_layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
