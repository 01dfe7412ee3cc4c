// The families' tensor tables (loader/families/): every tensor carries the
// role plan shards it by and the slot the model places it in, so that
// neither reads a Hugging Face name; each architecture round-trips through
// make-model's config.json; a sliding window is honoured or refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/families/family.h"
#include "loader/model_catalog.h"
#include "loader/model_spec.h"

namespace shardlm {
namespace {

// The official configs: $SHARDLM_MODEL_CONFIGS, else shared/model-configs/
// beside the source tree (the tests skip where neither is).
std::filesystem::path model_configs() {
  if (const char* env = std::getenv("SHARDLM_MODEL_CONFIGS")) return env;
  if (const char* src = std::getenv("SHARDLM_SOURCE_DIR")) {
    const std::filesystem::path beside = std::filesystem::path(src) / ".." / "shared" / "model-configs";
    if (std::filesystem::is_directory(beside)) return beside;
  }
  return "/work/shared/model-configs";
}

TEST(FamilyTable, EveryCatalogTensorHasARoleASlotAndASpace) {
  std::set<Family> seen;
  for (const auto& m : model_catalog()) {
    ModelSpec spec = catalog_model_spec(m.name);
    seen.insert(spec.family);
    std::map<TensorSlot, int> per_layer0;
    for (const TensorSpec& t : expected_tensors(spec)) {
      const bool split = t.role == ShardRole::kColumn || t.role == ShardRole::kRow;
      EXPECT_EQ(split, t.space != ShardSpace::kNone) << m.name << " " << t.name << " " << shard_role_name(t.role);
      const bool expert_role = t.role == ShardRole::kExpertColumn || t.role == ShardRole::kExpertRow;
      EXPECT_EQ(expert_role, t.expert >= 0) << m.name << " " << t.name;
      EXPECT_EQ(t.layer < 0, t.slot == TensorSlot::kEmbedding || t.slot == TensorSlot::kFinalNorm ||
                                 t.slot == TensorSlot::kLmHead)
          << m.name << " " << t.name;
      if (t.layer == 0 && t.role == ShardRole::kFusedParts) {
        for (const FusedPart& p : t.fused) ++per_layer0[p.slot];  // Phi-3: q, k, v (gate, up) in one tensor
      } else if (t.layer == 0) {
        ++per_layer0[t.slot];
      }
      // A Linear's tensors name their module; the weight (or qweight) is its primary part.
      if (t.part == QuantPart::kNone && t.layer >= 0 && t.shape.size() == 2 && t.slot != TensorSlot::kRouter)
        EXPECT_EQ(t.name, t.module + ".weight") << m.name;
    }
    // One q, k, v, o and one pair of norms per layer.
    for (TensorSlot s : {TensorSlot::kAttnNorm, TensorSlot::kQ, TensorSlot::kK, TensorSlot::kV, TensorSlot::kO,
                         TensorSlot::kMlpNorm})
      EXPECT_EQ(per_layer0[s], 1) << m.name << " " << tensor_slot_name(s);
    EXPECT_EQ(per_layer0[TensorSlot::kQBias], spec.qkv_bias ? 1 : 0) << m.name;
    EXPECT_EQ(per_layer0[TensorSlot::kQNorm], spec.qk_norm ? 1 : 0) << m.name;
    if (spec.is_moe_layer(0)) {
      EXPECT_EQ(per_layer0[TensorSlot::kRouter], 1) << m.name;
      EXPECT_EQ(per_layer0[TensorSlot::kExpertDown], spec.n_experts) << m.name;
      EXPECT_EQ(per_layer0[TensorSlot::kGate], 0) << m.name;
    } else {
      EXPECT_EQ(per_layer0[TensorSlot::kGate], 1) << m.name;
    }
  }
  std::set<Family> defined;
  for (const FamilyDef* d : family_defs()) defined.insert(d->family);
  EXPECT_EQ(seen, defined) << "a family without a catalog model";
}

TEST(FamilyTable, RolesFollowTheLinearNotTheName) {
  ModelSpec spec = catalog_model_spec("mixtral-8x7b");
  std::map<std::string, ShardRole> role;
  for (const TensorSpec& t : expected_tensors(spec)) role[t.name] = t.role;
  EXPECT_EQ(role["model.layers.0.self_attn.q_proj.weight"], ShardRole::kColumn);
  EXPECT_EQ(role["model.layers.0.self_attn.o_proj.weight"], ShardRole::kRow);
  EXPECT_EQ(role["model.layers.0.block_sparse_moe.gate.weight"], ShardRole::kRouter);
  EXPECT_EQ(role["model.layers.0.block_sparse_moe.experts.3.w1.weight"], ShardRole::kExpertColumn);
  EXPECT_EQ(role["model.layers.0.block_sparse_moe.experts.3.w2.weight"], ShardRole::kExpertRow);
  EXPECT_EQ(role["model.layers.0.block_sparse_moe.experts.3.w3.weight"], ShardRole::kExpertColumn);
  EXPECT_EQ(role["model.embed_tokens.weight"], ShardRole::kVocab);
  EXPECT_EQ(role["lm_head.weight"], ShardRole::kVocab);
  EXPECT_EQ(role["model.norm.weight"], ShardRole::kReplicated);
}

TEST(FamilyTable, EveryArchitectureRoundTripsThroughMakeModelsConfig) {
  for (const FamilyDef* d : family_defs()) {
    EXPECT_EQ(find_family(d->architecture), d);
    EXPECT_EQ(family_def(d->family).family, d->family);
  }
  EXPECT_EQ(find_family("GPT2LMHeadModel"), nullptr);
  for (const auto& m : model_catalog()) {
    ModelSpec spec = catalog_model_spec(m.name);
    ModelSpec back = parse_model_config(model_config_json(spec), "roundtrip");
    EXPECT_EQ(back.family, spec.family) << m.name;
    EXPECT_EQ(back.qkv_bias, spec.qkv_bias) << m.name;
    EXPECT_EQ(back.qk_norm, spec.qk_norm) << m.name;
    EXPECT_EQ(back.n_experts, spec.n_experts) << m.name;
    EXPECT_EQ(back.sliding_layers, spec.sliding_layers) << m.name;
    EXPECT_EQ(back.sliding_window, spec.sliding_window) << m.name;
    EXPECT_EQ(back.mlp_activation, spec.mlp_activation) << m.name;
    EXPECT_EQ(back.tie_word_embeddings, spec.tie_word_embeddings) << m.name;
    EXPECT_EQ(expected_tensors(back).size(), expected_tensors(spec).size()) << m.name;
  }
}

// Llama has no window: a sliding_window in its config is refused by name
// rather than silently computing full attention.
TEST(FamilyTable, SlidingWindowOnLlamaIsRefusedByName) {
  auto c = nlohmann::json::parse(find_catalog_model("llama-3.1-8b")->config_json);
  c["sliding_window"] = 4096;
  try {
    parse_model_config(c, "config.json");
    ADD_FAILURE() << "sliding_window accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("sliding_window=4096"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("LlamaForCausalLM"), std::string::npos) << e.what();
  }
  c["sliding_window"] = nullptr;
  EXPECT_NO_THROW(parse_model_config(c, "config.json"));
}

// The released Phi-3 / Phi-4 configs all parse: phi-4, Phi-3-mini-4k (a
// window on every layer), and the LongRoPE ones up to their original context.
TEST(FamilyTable, PhiConfigsParseOrAreRefusedByName) {
  const std::filesystem::path dir = model_configs();
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is not here";
  const ModelSpec phi4 = load_model_config(dir / "phi-4.json");
  EXPECT_EQ(phi4.family, Family::kPhi3);
  EXPECT_EQ(phi4.head_dim, 128);
  int fused = 0;
  for (const TensorSpec& t : expected_tensors(phi4))
    if (t.role == ShardRole::kFusedParts && t.layer == 0) {
      ++fused;
      int64_t rows = 0;
      for (const FusedPart& p : t.fused) rows += p.rows;
      EXPECT_EQ(rows, t.shape[0]) << t.name;
    }
  EXPECT_EQ(fused, 2);  // qkv_proj, gate_up_proj
  // Phi-3-mini-4k: transformers windows every layer to 2047 positions.
  const ModelSpec mini4k = load_model_config(dir / "Phi-3-mini-4k-instruct.json");
  EXPECT_EQ(mini4k.sliding_window, 2047);
  ASSERT_EQ(mini4k.sliding_layers.size(), static_cast<size_t>(mini4k.n_layers));
  for (int64_t l = 0; l < mini4k.n_layers; ++l) EXPECT_TRUE(mini4k.is_sliding_layer(l)) << l;
  // Phi-3-mini-128k ("su") and Phi-4-mini (partial rotary 0.75): LongRoPE's
  // short and long factors, one per rotary frequency; the long ones from 4096
  // on, over the whole 131,072 positions.
  for (auto [file, rotary] : {std::pair{"Phi-3-mini-128k-instruct.json", 96}, std::pair{"Phi-4-mini-instruct.json", 96}}) {
    const ModelSpec m = load_model_config(dir / file);
    EXPECT_EQ(m.rope_scaling.type, "longrope") << file;
    EXPECT_EQ(m.rotary_dim(), rotary) << file;
    EXPECT_EQ(m.rope_scaling.short_factor.size(), static_cast<size_t>(rotary / 2)) << file;
    EXPECT_EQ(m.rope_scaling.long_factor.size(), static_cast<size_t>(rotary / 2)) << file;
    EXPECT_EQ(m.max_position_embeddings, 131072) << file;
    EXPECT_EQ(m.long_rope_from(), 4096) << file;
    EXPECT_FALSE(m.long_context(4096)) << file;
    EXPECT_TRUE(m.long_context(4097)) << file;
    EXPECT_NEAR(m.rope_scaling.attention_factor, std::sqrt(1 + std::log(32.0) / std::log(4096.0)), 1e-12) << file;
  }
  auto bad = nlohmann::json::parse(std::ifstream(dir / "Phi-4-mini-instruct.json"));
  bad["rope_scaling"]["short_factor"].erase(0);
  try {
    parse_model_config(bad, "config.json");
    ADD_FAILURE() << "47 short factors accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope_scaling.short_factor must list 48 numbers"), std::string::npos)
        << e.what();
  }
}

// The released gemma-3-1b-it config: 22 local layers (window 512, rope base
// 1e4) and 4 global ones (5, 11, 17, 23), Gemma3TextConfig's defaults where the
// file is silent (tied embeddings), the sandwich norms in the table; what
// shardlm does not run is refused naming the field.
TEST(FamilyTable, GemmaConfigParsesOrIsRefusedByName) {
  const std::filesystem::path dir = model_configs();
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is not here";
  const ModelSpec g = load_model_config(dir / "gemma-3-1b-it.json");
  EXPECT_EQ(g.family, Family::kGemma3);
  EXPECT_EQ(g.head_dim, 256);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_TRUE(g.qk_norm);
  EXPECT_EQ(g.norm_weight_offset, 1.0f);
  EXPECT_EQ(g.mlp_activation, MlpActivation::kGeluTanh);
  EXPECT_EQ(g.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(g.sliding_window, 512);
  EXPECT_EQ(g.rope_local_theta, 10000.0);
  ASSERT_EQ(g.sliding_layers.size(), 26u);
  std::vector<int64_t> global;
  for (int64_t l = 0; l < g.n_layers; ++l)
    if (!g.is_sliding_layer(l)) global.push_back(l);
  EXPECT_EQ(global, (std::vector<int64_t>{5, 11, 17, 23}));
  std::map<TensorSlot, std::string> layer0;
  for (const TensorSpec& t : expected_tensors(g))
    if (t.layer == 0) layer0[t.slot] = t.name;
  EXPECT_EQ(layer0[TensorSlot::kPostAttnNorm], "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(layer0[TensorSlot::kMlpNorm], "model.layers.0.pre_feedforward_layernorm.weight");
  EXPECT_EQ(layer0[TensorSlot::kPostMlpNorm], "model.layers.0.post_feedforward_layernorm.weight");

  // layer_types, when given, wins over the pattern.
  auto c = nlohmann::json::parse(find_catalog_model("gemma-3-1b")->config_json);
  c["num_hidden_layers"] = 3;
  c["layer_types"] = {"full_attention", "sliding_attention", "full_attention"};
  EXPECT_EQ(parse_model_config(c, "config.json").sliding_layers, (std::vector<bool>{false, true, false}));
  auto refused = [&](nlohmann::json config, const std::string& needle, ErrorCode code) {
    try {
      parse_model_config(config, "config.json");
      ADD_FAILURE() << needle << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto bad = c;
  bad["layer_types"] = {"full_attention"};
  refused(bad, "layer_types must list one entry per layer", ErrorCode::kInvalidArgument);
  bad = c;
  bad["layer_types"][1] = "chunked_attention";
  refused(bad, "layer_types[1] is \"chunked_attention\"", ErrorCode::kInvalidArgument);
  // final_logit_softcapping: read (null is none), and written back by make-model.
  EXPECT_EQ(parse_model_config(c, "config.json").final_logit_softcapping, 0.0);
  auto capped = c;
  capped["final_logit_softcapping"] = 30.0;
  EXPECT_EQ(parse_model_config(capped, "config.json").final_logit_softcapping, 30.0);
  bad = c;
  bad["final_logit_softcapping"] = -1.0;
  refused(bad, "final_logit_softcapping must be null or a positive number, found -1.0", ErrorCode::kInvalidArgument);
  bad = c;
  bad["final_logit_softcapping"] = "30";
  refused(bad, "final_logit_softcapping must be null or a positive number, found \"30\"", ErrorCode::kInvalidArgument);
  bad = c;
  bad["attn_logit_softcapping"] = 50.0;
  refused(bad, "attn_logit_softcapping=50.0", ErrorCode::kUnsupported);
  bad = c;
  bad["hidden_activation"] = "gelu";
  refused(bad, "hidden_activation \"gelu\"", ErrorCode::kUnsupported);
  bad = c;
  bad["sliding_window"] = 0;
  refused(bad, "sliding_window must be a positive", ErrorCode::kInvalidArgument);
}

// gemma-3-4b-it (Gemma3ForConditionalGeneration): its sparse text_config over
// Gemma3TextConfig's defaults, the language model's tensors under
// language_model., linear rope scaling for the global layers; the vision
// tower is not part of the table, and a checkpoint's vision tensors are not
// unexpected.
TEST(FamilyTable, MultimodalGemmaLoadsItsLanguageModel) {
  const std::filesystem::path dir = model_configs();
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << dir << " is not here";
  const auto file = nlohmann::json::parse(std::ifstream(dir / "gemma-3-4b-it.json"));
  const ModelSpec g = parse_model_config(file, "gemma-3-4b-it/config.json");
  EXPECT_EQ(g.family, Family::kGemma3);
  EXPECT_EQ(g.architecture, "Gemma3ForConditionalGeneration");
  // Every resolved field the file records (transformers' own defaults filled in) agrees.
  const auto& r = file["_text_config_resolved"];
  EXPECT_EQ(g.hidden_size, r["hidden_size"].get<int64_t>());
  EXPECT_EQ(g.n_layers, r["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(g.n_heads, r["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(g.n_kv_heads, r["num_key_value_heads"].get<int64_t>());
  EXPECT_EQ(g.head_dim, r["head_dim"].get<int64_t>());
  EXPECT_EQ(g.vocab_size, r["vocab_size"].get<int64_t>());
  EXPECT_EQ(g.max_position_embeddings, r["max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(g.sliding_window, r["sliding_window"].get<int64_t>());
  EXPECT_EQ(g.query_pre_attn_scalar, r["query_pre_attn_scalar"].get<double>());
  EXPECT_EQ(g.rope_theta, r["rope_theta"].get<double>());
  EXPECT_EQ(g.rope_local_theta, r["rope_local_base_freq"].get<double>());
  EXPECT_EQ(g.rope_scaling.type, "linear");
  EXPECT_EQ(g.rope_scaling.factor, 8.0);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{1, 106}));
  std::vector<int64_t> global;
  for (int64_t l = 0; l < g.n_layers; ++l)
    if (!g.is_sliding_layer(l)) global.push_back(l);
  EXPECT_EQ(global, (std::vector<int64_t>{5, 11, 17, 23, 29}));
  for (const TensorSpec& t : expected_tensors(g)) EXPECT_EQ(t.name.rfind("language_model.", 0), 0u) << t.name;
  // make-model's config.json for it nests the fields again and reads back the same.
  const nlohmann::json written = model_config_json(g);
  EXPECT_TRUE(written.contains("text_config")) << written.dump();
  const ModelSpec back = parse_model_config(written, "written");
  EXPECT_EQ(back.hidden_size, g.hidden_size);
  EXPECT_EQ(back.sliding_layers, g.sliding_layers);
  EXPECT_EQ(back.tensor_prefix, "language_model.");
  auto no_text = file;
  no_text.erase("text_config");
  try {
    parse_model_config(no_text, "config.json");
    ADD_FAILURE() << "accepted without text_config";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("text_config"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
