// Planning and slicing quantized checkpoints: exact bytes of the published
// layouts, and TP slices on whole groups / packed words.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "plan/sharding.h"

namespace shardlm {
namespace {

ModelSpec quantized(const char* model, const char* format, int64_t group = 128, bool desc_act = false) {
  ModelSpec spec = catalog_model_spec(model);
  spec.quant = published_quant_config(format, group, desc_act, true, "--quantization");
  spec.dtype = std::string(format) == "fp8" ? DType::kBF16 : DType::kF16;
  check_quantized_shapes(spec, "test");
  return spec;
}

// docs/plan.md's table of the seeds' figures.
TEST(QuantizedSharding, CatalogBytesMatchTheSeedsTable) {
  EXPECT_EQ(rank_weight_bytes(quantized("qwen2.5-72b", "awq"), Layout{}, 0, 0), 41464774656);   // "about 40 GB"
  EXPECT_EQ(rank_weight_bytes(quantized("qwen2.5-72b", "gptq"), Layout{}, 0, 0), 41489965056);
  EXPECT_EQ(rank_weight_bytes(quantized("qwen2.5-7b", "gptq-int8"), Layout{}, 0, 0), 8863411200);  // "about 8 GB"
  EXPECT_EQ(rank_weight_bytes(quantized("qwen2.5-7b", "fp8"), Layout{}, 0, 0), 8706741120);
}

// GPTQ "lm_head": true on Qwen2.5-7B (untied, vocab 152064, hidden 3584):
// every part of the lm_head split by vocabulary rows, packed-word aligned,
// and counted at its packed size (qweight [448, V] I32, qzeros [28, V/p],
// scales [28, V] F16, g_idx [3584] on every rank) instead of V x 3584 F16.
TEST(QuantizedSharding, AQuantizedLmHeadIsSplitByVocabRowsAtItsPackedSize) {
  for (const char* format : {"gptq", "gptq-int8"}) {
    ModelSpec plain = quantized("qwen2.5-7b", format);
    ModelSpec spec = plain;
    enable_quantized_lm_head(spec.quant, "--lm-head");
    check_quantized_shapes(spec, "test");
    const int64_t V = 152064, K = 3584, G = K / 128, pf = 32 / spec.quant.bits;
    const int64_t head = (K / pf) * V * 4 + G * (V / pf) * 4 + G * V * 2 + K * 4;
    EXPECT_EQ(rank_weight_bytes(plain, Layout{}, 0, 0) - rank_weight_bytes(spec, Layout{}, 0, 0), V * K * 2 - head)
        << format;
    for (int tp : {2, 3, 7}) {
      const Layout layout{tp, 1, 1, {}};
      int64_t sum = 0;
      for (int r = 0; r < tp; ++r) {
        const Range vocab = shard_for(spec, layout, r, 0).vocab;
        EXPECT_EQ(vocab.begin % pf, 0) << format << " TP=" << tp << " rank " << r;
        int64_t rank_head = 0;
        for (const TensorShard& t : rank_tensors(spec, layout, r, 0)) {
          if (t.slot != TensorSlot::kLmHead) continue;
          rank_head += t.bytes;
          if (t.name == "lm_head.qweight" || t.name == "lm_head.scales") {
            EXPECT_EQ(t.split_dim, 1) << t.name;
            EXPECT_EQ(t.slice.begin, vocab.begin) << t.name;
            EXPECT_EQ(t.slice.end, vocab.end) << t.name;
          } else if (t.name == "lm_head.qzeros") {
            EXPECT_EQ(t.split_dim, 1);
            EXPECT_EQ(t.slice.begin * pf, vocab.begin);
            EXPECT_EQ(t.slice.end * pf, vocab.end);
          } else {
            EXPECT_EQ(t.name, "lm_head.g_idx");
            EXPECT_EQ(t.split_dim, -1);  // every rank's rows need all input groups
          }
        }
        EXPECT_EQ(rank_head, ((K / pf) * 4 + G * 2) * vocab.size() + G * (vocab.size() / pf) * 4 + K * 4);
        sum += rank_head - K * 4;
      }
      EXPECT_EQ(sum, head - K * 4) << format << " TP=" << tp;  // the slices tile lm_head (g_idx replicated)
    }
  }
}

// Every part of every quantized Linear is split so that the ranks' slices
// tile the checkpoint tensor (or replicate it where act-order needs it).
TEST(QuantizedSharding, SlicesTileTheTensorsOnGroupBoundaries) {
  for (const char* format : {"awq", "gptq", "gptq-int8", "fp8"}) {
    for (bool desc_act : {false, true}) {
      if (desc_act && std::string(format) == "awq") continue;
      if (desc_act && std::string(format) == "fp8") continue;
      ModelSpec spec = quantized("qwen2.5-7b", format, 128, desc_act);
      spec.n_layers = 1;
      for (int tp : {2, 3, 4, 7}) {
        Layout layout{tp, 1, 1, {}};
        std::map<std::string, int64_t> covered;
        std::map<std::string, int64_t> full;
        for (int r = 0; r < tp; ++r) {
          for (const TensorShard& t : rank_tensors(spec, layout, r, 0)) {
            full[t.name] = shape_numel(t.full_shape);
            covered[t.name] += shape_numel(t.local_shape);
            if (t.name.find("down_proj.qweight") != std::string::npos && std::string(format) == "awq") {
              // Row slice of [K, N/8]: whole groups of 128 input rows.
              EXPECT_EQ(t.split_dim, 0);
              EXPECT_EQ(t.slice.begin % 128, 0) << tp << " " << r;
            }
            if (t.name.find("q_proj.qweight") != std::string::npos && std::string(format) != "fp8" &&
                std::string(format) != "awq")
              EXPECT_EQ(t.split_dim, 1);  // GPTQ qweight [K/8, N]: output channels are dim 1
            if (desc_act && t.name.find("o_proj.scales") != std::string::npos) EXPECT_EQ(t.split_dim, -1);
          }
        }
        for (const auto& [name, n] : full) {
          const bool replicated_ok = name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos ||
                                     name.find("norm") != std::string::npos || name.find("g_idx") != std::string::npos ||
                                     (desc_act && (name.find("o_proj") != std::string::npos ||
                                                   name.find("down_proj") != std::string::npos));
          if (replicated_ok) EXPECT_GE(covered[name], n) << format << " tp " << tp << " " << name;
          else EXPECT_EQ(covered[name], n) << format << " tp " << tp << " " << name;
        }
      }
    }
  }
}

TEST(QuantizedSharding, SlicesThatWouldCutGroupsAreRefused) {
  // 7B intermediate 18944 = 148 groups of 128: TP 3 takes 50/49/49 groups.
  ModelSpec spec = quantized("qwen2.5-7b", "awq");
  RankShard s0 = shard_for(spec, Layout{3, 1, 1, {}}, 0, 0);
  EXPECT_EQ(s0.intermediate.size(), 50 * 128);
  // Qwen2.5-0.5B: 14 heads of 64; group 128 needs head pairs, so 14 heads split in units of 2.
  ModelSpec small = quantized("qwen2.5-0.5b", "awq");
  EXPECT_NO_THROW(validate_layout(small, Layout{7, 1, 1, {}}));
  try {
    validate_layout(small, Layout{14, 1, 1, {}});
    FAIL() << "TP 14 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fall on whole quantization groups of 128 rows"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace shardlm
