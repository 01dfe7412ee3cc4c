// quantization_config parsing, the quantized tensor inventory, its checks
// against real checkpoints, and the round-to-nearest packers against the
// scalar dequantizer.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/checkpoint.h"
#include "loader/model_spec.h"
#include "loader/quant_config.h"
#include "loader/quant_pack.h"
#include "loader/synthetic_checkpoint.h"
#include "test_files.h"

namespace shardlm {
namespace {

using nlohmann::json;

// As the published repositories' config.json carry them.
const char* const kQwenAwq = R"({"bits": 4, "group_size": 128, "modules_to_not_convert": null,
  "quant_method": "awq", "version": "gemm", "zero_point": true})";
const char* const kQwenGptq = R"({"batch_size": 1, "bits": 4, "block_name_to_quantize": null,
  "cache_block_outputs": true, "damp_percent": 0.01, "dataset": null, "desc_act": false,
  "exllama_config": {"version": 1}, "group_size": 128, "max_input_length": null, "model_seqlen": null,
  "module_name_preceding_first_block": null, "modules_in_block_to_quantize": null, "pad_token_id": null,
  "quant_method": "gptq", "sym": true, "tokenizer": null, "true_sequential": true, "use_cuda_fp16": false,
  "use_exllama": true})";
const char* const kQwen3Fp8 = R"({"activation_scheme": "dynamic", "modules_to_not_convert": ["lm_head"],
  "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]})";
// AutoGPTQ's quantize_config.json of older checkpoints: no quant_method.
const char* const kOldQuantizeConfig = R"({"bits": 8, "group_size": 128, "damp_percent": 0.01,
  "desc_act": true, "static_groups": false, "sym": true, "true_sequential": true,
  "model_name_or_path": null, "model_file_base_name": "model"})";

QuantConfig parse(const std::string& text, bool separate = false) {
  return parse_quantization_config(json::parse(text), "config.json quantization_config", separate);
}

// The message of the error parsing `text` after replacing field `key` with `value`.
std::string refusal(const char* base, const std::string& key, const json& value) {
  json c = json::parse(base);
  c[key] = value;
  try {
    parse_quantization_config(c, "config.json quantization_config", false);
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(QuantConfig, PublishedConfigsParse) {
  QuantConfig awq = parse(kQwenAwq);
  EXPECT_EQ(awq.method, QuantMethod::kAwq);
  EXPECT_EQ(awq.bits, 4);
  EXPECT_EQ(awq.group_size, 128);
  EXPECT_EQ(awq.describe(), "awq 4-bit group 128");
  QuantConfig gptq = parse(kQwenGptq);
  EXPECT_EQ(gptq.method, QuantMethod::kGptq);
  EXPECT_TRUE(gptq.sym);
  EXPECT_EQ(gptq.zero_offset, 1);  // checkpoint_format "gptq": stored zero is zero - 1
  QuantConfig fp8 = parse(kQwen3Fp8);
  EXPECT_EQ(fp8.method, QuantMethod::kFp8);
  EXPECT_EQ(fp8.weight_block_size, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(fp8.scales_dtype, DType::kBF16);
  EXPECT_FALSE(fp8.quantizes("lm_head"));
  EXPECT_TRUE(fp8.quantizes("model.layers.0.mlp.down_proj"));
  QuantConfig old = parse(kOldQuantizeConfig, true);
  EXPECT_EQ(old.method, QuantMethod::kGptq);
  EXPECT_EQ(old.bits, 8);
  EXPECT_TRUE(old.desc_act);
  // Written back as the repositories hold it, and read again the same.
  for (const char* text : {kQwenAwq, kQwenGptq, kQwen3Fp8}) {
    QuantConfig q = parse(text);
    QuantConfig back = parse(quantization_config_json(q).dump());
    EXPECT_EQ(back.describe(), q.describe());
  }
}

TEST(QuantConfig, UnsupportedValuesAreRefusedNamingFieldValueAndSupported) {
  EXPECT_EQ(refusal(kQwenAwq, "bits", 3),
            "config.json quantization_config: field \"bits\" is 3; shardlm runs awq with bits 4");
  EXPECT_EQ(refusal(kQwenAwq, "group_size", 96),
            "config.json quantization_config: field \"group_size\" is 96; shardlm runs awq with group_size 64, 128");
  EXPECT_NE(refusal(kQwenAwq, "version", "gemv").find("field \"version\" is \"gemv\"; shardlm runs awq with version \"gemm\""),
            std::string::npos);
  EXPECT_NE(refusal(kQwenAwq, "zero_point", false).find("field \"zero_point\" is false"), std::string::npos);
  EXPECT_EQ(refusal(kQwenGptq, "bits", 2),
            "config.json quantization_config: field \"bits\" is 2; shardlm runs gptq with bits 4, 8");
  EXPECT_NE(refusal(kQwenGptq, "checkpoint_format", "marlin")
                .find("field \"checkpoint_format\" is \"marlin\"; shardlm runs gptq with checkpoint_format \"gptq\", \"gptq_v2\""),
            std::string::npos);
  // AutoAWQ has no quantized lm_head layout; GPTQ's is read (below).
  EXPECT_NE(refusal(kQwenAwq, "lm_head", true)
                .find("config.json quantization_config: field \"lm_head\" is true; shardlm runs awq with lm_head false"),
            std::string::npos);
  EXPECT_EQ(refusal(kQwenAwq, "lm_head", false), "(accepted)");
  EXPECT_NE(refusal(kQwenGptq, "modules_in_block_to_quantize", json::array({json::array({"self_attn.q_proj"})}))
                .find("modules_in_block_to_quantize"),
            std::string::npos);
  EXPECT_EQ(refusal(kQwen3Fp8, "fmt", "e5m2"),
            "config.json quantization_config: field \"fmt\" is \"e5m2\"; shardlm runs fp8 with fmt \"e4m3\"");
  EXPECT_NE(refusal(kQwen3Fp8, "activation_scheme", "static").find("field \"activation_scheme\" is \"static\""),
            std::string::npos);
  EXPECT_NE(refusal(kQwen3Fp8, "weight_block_size", json::array({128})).find("\"weight_block_size\" must be two positive integers"),
            std::string::npos);
  EXPECT_NE(refusal(kQwenAwq, "quant_method", "bitsandbytes")
                .find("field \"quant_method\" is \"bitsandbytes\"; shardlm reads \"awq\", \"gptq\" and \"fp8\""),
            std::string::npos);
  EXPECT_NE(refusal(kQwenAwq, "bits", "4").find("field \"bits\" must be an integer, found \"4\""), std::string::npos);
  // A field shardlm does not know is refused, not ignored.
  EXPECT_NE(refusal(kQwen3Fp8, "kv_cache_scheme", "fp8").find("field \"kv_cache_scheme\" (\"fp8\") is not a fp8 field"),
            std::string::npos);
  json c = json::parse(kQwenAwq);
  c.erase("quant_method");
  EXPECT_THROW(parse_quantization_config(c, "q", false), Error);  // only quantize_config.json may omit it
}

json small_config(const char* quant) {
  json c = json::parse(testing::kTinyConfig);
  c["hidden_size"] = 128;
  c["intermediate_size"] = 256;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 2;
  c["head_dim"] = 32;
  c["torch_dtype"] = "float16";
  c["quantization_config"] = json::parse(quant);
  if (c["quantization_config"]["quant_method"] != "fp8") c["quantization_config"]["group_size"] = 64;
  return c;
}

TEST(QuantConfig, TensorInventoryFollowsThePublishedLayouts) {
  ModelSpec awq = parse_model_config(small_config(kQwenAwq), "config.json");
  std::map<std::string, TensorSpec> by_name;
  for (const TensorSpec& t : expected_tensors(awq)) by_name[t.name] = t;
  EXPECT_EQ(by_name.count("model.layers.0.mlp.down_proj.weight"), 0u);
  // down_proj [128, 256]: qweight [K=256, N/8=16], qzeros [K/g=4, 16], scales [4, 128].
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.qweight").shape, (std::vector<int64_t>{256, 16}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.qzeros").shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.scales").shape, (std::vector<int64_t>{4, 128}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.qweight").dtypes.front(), DType::kI32);
  EXPECT_EQ(by_name.at("model.embed_tokens.weight").dtypes.size(), 0u);  // torch_dtype
  ModelSpec gptq = parse_model_config(small_config(kQwenGptq), "config.json");
  by_name.clear();
  for (const TensorSpec& t : expected_tensors(gptq)) by_name[t.name] = t;
  // GPTQ 4-bit: qweight [K/8=32, N=128], qzeros [4, N/8=16], g_idx [256].
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.qweight").shape, (std::vector<int64_t>{32, 128}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.qzeros").shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(by_name.at("model.layers.0.mlp.down_proj.g_idx").shape, (std::vector<int64_t>{256}));
  // in_features not a multiple of group_size: refused before loading, naming the module.
  json bad = small_config(kQwenAwq);
  bad["intermediate_size"] = 160;
  try {
    parse_model_config(bad, "config.json");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.down_proj has 160 input features, not a multiple of "
                                         "quantization_config group_size=64"),
              std::string::npos)
        << e.what();
  }
}

SyntheticModelOptions small_options(const std::string& quantize) {
  SyntheticModelOptions o;
  o.like = "qwen2.5-0.5b";
  o.n_layers = 1;
  o.vocab_size = 320;
  o.hidden_size = 256;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.intermediate_size = 512;
  o.dtype = quantize == "fp8" ? DType::kBF16 : DType::kF16;
  o.quantize = quantize;
  o.group_size = 64;
  o.seed = 5;
  return o;
}

TEST(QuantConfig, SyntheticQuantizedCheckpointsPassStrictChecks) {
  for (const char* format : {"awq", "gptq", "gptq-int8", "fp8"}) {
    auto dir = testing::fresh_dir(std::string("quant_ok_") + format);
    write_synthetic_model(dir, small_options(format));
    Checkpoint ck = Checkpoint::open(dir);
    ModelSpec spec = load_model_config(dir / "config.json");
    EXPECT_TRUE(spec.quant.enabled()) << format;
    std::vector<Problem> problems = validate_against_spec(ck, spec);
    for (const Problem& p : problems) ADD_FAILURE() << format << ": " << p.text();
  }
}

TEST(QuantConfig, TensorsContradictingTheConfigAreNamedWithBothShapes) {
  auto dir = testing::fresh_dir("quant_bad_group");
  write_synthetic_model(dir, small_options("awq"));
  // The weights were quantized with group 64; a config claiming 128 halves the groups.
  json c = json::parse(testing::read_text(dir / "config.json"));
  c["quantization_config"]["group_size"] = 128;
  testing::write_text(dir / "config.json", c.dump());
  ModelSpec spec = load_model_config(dir / "config.json");
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), spec);
  ASSERT_FALSE(problems.empty());
  bool found = false;
  for (const Problem& p : problems)
    found = found ||
            (p.message.rfind("tensor model.layers.0.self_attn.q_proj.qzeros has shape [4, 32], but ", 0) == 0 &&
             p.message.find("config.json quantization_config (awq 4-bit group 128) stores the [256, 256] Linear "
                            "model.layers.0.self_attn.q_proj with qzeros [2, 32]") != std::string::npos);
  EXPECT_TRUE(found) << problems[0].text();
}

TEST(QuantConfig, QuantizedStorageWithoutAConfigIsNamed) {
  auto dir = testing::fresh_dir("quant_no_config");
  write_synthetic_model(dir, small_options("gptq"));
  json c = json::parse(testing::read_text(dir / "config.json"));
  c.erase("quantization_config");
  testing::write_text(dir / "config.json", c.dump());
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), load_model_config(dir / "config.json"));
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].message.find("is quantized storage, but config.json has no quantization_config"), std::string::npos)
      << problems[0].text();
}

TEST(QuantConfig, WrongStorageDtypesAreNamed) {
  // Every tensor written as BF16 under an AWQ config: qweight must be I32.
  auto dir = testing::fresh_dir("quant_bf16_storage");
  testing::write_tiny_model(dir, small_config(kQwenAwq).dump());
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), load_model_config(dir / "config.json"));
  bool found = false;
  for (const Problem& p : problems)
    found = found || p.message == "tensor model.layers.0.self_attn.q_proj.qweight is BF16, but awq stores qweight as I32";
  EXPECT_TRUE(found);
}

TEST(QuantConfig, SeparateQuantizeConfigJsonIsRead) {
  auto dir = testing::fresh_dir("quant_separate");
  write_synthetic_model(dir, small_options("gptq"));
  json c = json::parse(testing::read_text(dir / "config.json"));
  json q = c["quantization_config"];
  c.erase("quantization_config");
  q.erase("quant_method");
  testing::write_text(dir / "config.json", c.dump());
  testing::write_text(dir / "quantize_config.json", q.dump());
  ModelSpec spec = load_model_config(dir / "config.json");
  EXPECT_EQ(spec.quant.method, QuantMethod::kGptq);
  EXPECT_NE(spec.quant.source.find("quantize_config.json"), std::string::npos);
  EXPECT_TRUE(validate_against_spec(Checkpoint::open(dir), spec).empty());
  q["bits"] = 3;
  testing::write_text(dir / "quantize_config.json", q.dump());
  EXPECT_THROW(load_model_config(dir / "config.json"), Error);
}

TEST(QuantConfig, GptqLmHeadIsAQuantizedLinearSlicedByVocabRows) {
  json c = json::parse(kQwenGptq);
  c["lm_head"] = true;
  const QuantConfig q = parse(c.dump());
  EXPECT_TRUE(q.lm_head);
  EXPECT_TRUE(q.quantizes("lm_head"));
  EXPECT_TRUE(q.quantizes("language_model.lm_head"));
  EXPECT_FALSE(q.quantizes("model.embed_tokens"));
  EXPECT_FALSE(parse(kQwenGptq).quantizes("lm_head"));
  EXPECT_EQ(q.describe(), "gptq 4-bit group 128 sym lm_head");
  EXPECT_TRUE(parse(quantization_config_json(q).dump()).lm_head);  // written back as GPTQModel writes it
  // enable_quantized_lm_head is for GPTQ only, naming the flag.
  QuantConfig awq = parse(kQwenAwq);
  try {
    enable_quantized_lm_head(awq, "--lm-head");
    ADD_FAILURE() << "awq accepted --lm-head";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--lm-head applies to gptq and gptq-int8"), std::string::npos) << e.what();
  }
}

// make-model --lm-head (int4 and int8): lm_head.{qweight,qzeros,scales,g_idx}
// with the vocab role, the tied catalog model written untied, and the whole
// checkpoint passing the strict checks.
TEST(QuantConfig, SyntheticQuantizedLmHeadPassesStrictChecks) {
  for (const char* format : {"gptq", "gptq-int8"}) {
    SyntheticModelOptions o = small_options(format);
    o.quantize_lm_head = true;
    auto dir = testing::fresh_dir(std::string("quant_lm_head_") + format);
    write_synthetic_model(dir, o);
    const ModelSpec spec = load_model_config(dir / "config.json");
    EXPECT_TRUE(spec.quant.lm_head) << format;
    EXPECT_FALSE(spec.tie_word_embeddings) << format << ": qwen2.5-0.5b is tied, --lm-head unties it";
    std::map<std::string, const TensorSpec*> by_name;
    const std::vector<TensorSpec> tensors = expected_tensors(spec);
    for (const TensorSpec& t : tensors) by_name[t.name] = &t;
    EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
    const int64_t pf = 32 / spec.quant.bits;
    ASSERT_TRUE(by_name.count("lm_head.qweight"));
    EXPECT_EQ(by_name["lm_head.qweight"]->shape, (std::vector<int64_t>{256 / pf, 320}));
    EXPECT_EQ(by_name["lm_head.qzeros"]->shape, (std::vector<int64_t>{4, 320 / pf}));
    EXPECT_EQ(by_name["lm_head.scales"]->shape, (std::vector<int64_t>{4, 320}));
    EXPECT_EQ(by_name["lm_head.g_idx"]->shape, (std::vector<int64_t>{256}));
    for (const char* part : {"lm_head.qweight", "lm_head.qzeros", "lm_head.scales", "lm_head.g_idx"}) {
      EXPECT_EQ(by_name[part]->role, ShardRole::kVocab) << part;
      EXPECT_EQ(by_name[part]->slot, TensorSlot::kLmHead) << part;
    }
    for (const Problem& p : validate_against_spec(Checkpoint::open(dir), spec)) ADD_FAILURE() << format << ": " << p.text();
  }
}

TEST(QuantConfig, AMissingQuantizedLmHeadIsNamed) {
  // A GPTQ checkpoint whose lm_head is F16, under a config that says "lm_head": true.
  SyntheticModelOptions o = small_options("gptq");
  o.tie_word_embeddings = false;
  auto dir = testing::fresh_dir("quant_lm_head_missing");
  write_synthetic_model(dir, o);
  json c = json::parse(testing::read_text(dir / "config.json"));
  c["quantization_config"]["lm_head"] = true;
  testing::write_text(dir / "config.json", c.dump());
  const ModelSpec spec = load_model_config(dir / "config.json");
  std::vector<Problem> problems = validate_against_spec(Checkpoint::open(dir), spec);
  bool named = false, extra = false;
  for (const Problem& p : problems) {
    named = named || (p.tensor == "lm_head.qweight" &&
                      p.message.rfind("tensor lm_head.qweight is missing; ", 0) == 0 &&
                      p.message.find("quantization_config has \"lm_head\": true, so the lm_head is stored quantized "
                                     "(gptq 4-bit group 64 sym lm_head) as lm_head.qweight") != std::string::npos);
    extra = extra || p.tensor == "lm_head.weight";
  }
  EXPECT_TRUE(named) << (problems.empty() ? "no problems" : problems[0].text());
  EXPECT_TRUE(extra) << "the F16 lm_head.weight is not what the config describes";
  EXPECT_THROW(require_matches_spec(Checkpoint::open(dir), spec), Error);
}

TEST(QuantConfig, LmHeadRefusalsNameTheFileAndField) {
  // AWQ: in config.json, and in a separate quantize_config.json.
  SyntheticModelOptions o = small_options("awq");
  auto dir = testing::fresh_dir("quant_awq_lm_head");
  write_synthetic_model(dir, o);
  json c = json::parse(testing::read_text(dir / "config.json"));
  c["quantization_config"]["lm_head"] = true;
  testing::write_text(dir / "config.json", c.dump());
  const std::string config_path = (dir / "config.json").string();
  auto message = [](const std::filesystem::path& config) -> std::string {
    try {
      load_model_config(config);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(message(dir / "config.json").rfind(config_path + " quantization_config: field \"lm_head\" is true; "
                                               "shardlm runs awq with lm_head false (AutoAWQ keeps lm_head",
                                               0),
            0u)
      << message(dir / "config.json");
  json q = c["quantization_config"];
  c.erase("quantization_config");
  testing::write_text(dir / "config.json", c.dump());
  testing::write_text(dir / "quantize_config.json", q.dump());
  EXPECT_EQ(message(dir / "config.json").rfind((dir / "quantize_config.json").string() + ": field \"lm_head\" is true", 0), 0u)
      << message(dir / "config.json");
  // GPTQ with a tied embedding: no reading of it would match GPTQModel's and vLLM's.
  SyntheticModelOptions g = small_options("gptq");
  auto gdir = testing::fresh_dir("quant_gptq_lm_head_tied");
  write_synthetic_model(gdir, g);  // qwen2.5-0.5b: tied
  json gc = json::parse(testing::read_text(gdir / "config.json"));
  gc["quantization_config"]["lm_head"] = true;
  testing::write_text(gdir / "config.json", gc.dump());
  const std::string m = message(gdir / "config.json");
  EXPECT_EQ(m.rfind((gdir / "config.json").string() + " quantization_config: field \"lm_head\" is true (a quantized "
                    "lm_head) but config.json has tie_word_embeddings=true", 0),
            0u)
      << m;
}

// Round to nearest, then the scalar dequantizer: every element within one
// quantization step (half a step but for the clamped extremes).
TEST(QuantPack, RoundTripStaysWithinTheStep) {
  const int64_t n_out = 64, n_in = 256;
  std::vector<float> w(static_cast<size_t>(n_out * n_in));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i)) * 0.1f;
  struct Case {
    const char* config;
    int64_t group;
    bool desc_act;
    bool sym;
  };
  for (const Case& c : {Case{kQwenAwq, 64, false, true}, Case{kQwenGptq, 64, false, true}, Case{kQwenGptq, 32, true, false},
                        Case{kQwenGptq, -1, false, true}, Case{kQwen3Fp8, 0, false, true}}) {
    json j = json::parse(c.config);
    if (c.group != 0) j["group_size"] = c.group;
    if (j["quant_method"] == "gptq") {
      j["desc_act"] = c.desc_act;
      j["sym"] = c.sym;
    }
    for (int bits : {4, 8}) {
      if (j["quant_method"] != "gptq" && bits == 8) continue;
      if (j["quant_method"] == "gptq") j["bits"] = bits;
      QuantConfig q = parse_quantization_config(j, "test", false);
      std::vector<TensorSpec> parts;
      // The parts of one [n_out, n_in] Linear.
      json mc = small_config(c.config);
      mc["quantization_config"] = j;
      mc["hidden_size"] = n_in;
      mc["intermediate_size"] = n_out * 4;
      for (const TensorSpec& t : expected_tensors(parse_model_config(mc, "x")))
        if (t.module == "model.layers.0.self_attn.k_proj") parts.push_back(t);
      ASSERT_FALSE(parts.empty());
      const int64_t ko = parts[0].out_features;
      std::vector<float> wk(w.begin(), w.begin() + ko * n_in);
      auto bytes = quantize_linear(q, wk.data(), ko, n_in, parts);
      std::map<QuantPart, QuantPartView> views;
      for (const TensorSpec& t : parts) views[t.part] = {bytes.at(t.part).data(), t.dtypes.front(), t.shape};
      std::vector<float> back = dequantize_linear(q, views, ko, n_in);
      double worst = 0;
      for (int64_t i = 0; i < ko * n_in; ++i) {
        const double err = std::fabs(back[i] - wk[i]);
        if (q.method == QuantMethod::kFp8) {
          worst = std::max(worst, err / (std::fabs(wk[i]) / 16 + 1e-6));
        } else {
          const double step = 0.2 / ((1 << q.bits) - 1);  // max - min <= 0.2 in every group
          worst = std::max(worst, err / step);
        }
      }
      EXPECT_LE(worst, 1.01) << q.describe();
    }
  }
}

}  // namespace
}  // namespace shardlm
