// The decode benchmark behind `generate --decode-bench` and the GPU check's
// roofline: it runs real decode steps and counts the bytes a step reads.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/decode_bench.h"
#include "random_weights.h"

namespace shardlm {
namespace {

// A short run: `context` cached tokens per sequence, blocks of 4.
DecodeBenchOptions short_run(int64_t batch, int64_t context, int64_t steps, int64_t warmup) {
  DecodeBenchOptions o;
  o.batch = batch;
  o.context = context;
  o.n_steps = steps;
  o.n_warmup = warmup;
  o.block_size = 4;
  return o;
}

TEST(DecodeBench, TimesStepsAndCountsWeightAndKvBytes) {
  const ModelSpec spec = testing::qwen25_7b_like(256, 2, 128, 300);
  auto w = testing::random_weights(spec, 3);
  DecodeBenchOptions o = short_run(3, 5, 2, 1);
  o.kv_dtype = DType::kBF16;
  for (int tp : {1, 2}) {
    o.layout.tp = tp;
    const DecodeBenchResult r = decode_bench(spec, w, o);
    EXPECT_GT(r.seconds, 0.0);
    EXPECT_EQ(r.n_steps, 2);
    EXPECT_NEAR(r.tokens_per_second, 6.0 / r.seconds, 1e-6 * r.tokens_per_second);
    // K and V, 2 layers, 4 KV heads of 128 (each on one of the TP 2 ranks), bf16,
    // over a mean of 5 + 1 + 1 positions for each of the 3 sequences.
    EXPECT_EQ(r.kv_bytes_read, 3 * 7 * (2 * 2 * 4 * 128 * 2)) << "tp " << tp;
    EXPECT_GT(r.weight_bytes, 2 * 300 * 256 * 2);  // at least the embedding and lm_head
    // Untied: a step reads one embedding row (256 bf16) per sequence, not the
    // table of 300 rows; the lm_head whole.
    EXPECT_EQ(r.weight_bytes_read, r.weight_bytes - 300 * 256 * 2 + 3 * 256 * 2) << "tp " << tp;
    EXPECT_EQ(r.bytes_per_step(), r.weight_bytes_read + r.kv_bytes_read);
    EXPECT_EQ(r.prefill_tokens, 5);  // one sequence's context, in one chunk
    EXPECT_GT(r.prefill_seconds, 0.0);
    EXPECT_NEAR(r.prefill_tokens_per_second(), 5.0 / r.prefill_seconds, 1e-6 * r.prefill_tokens_per_second());
  }
}

TEST(DecodeBench, SeveralBatchesOverOneLoad) {
  const ModelSpec spec = testing::qwen25_7b_like(256, 1, 128, 300);
  auto w = testing::random_weights(spec, 5);
  const DecodeBenchOptions o = short_run(1, 3, 1, 0);
  const auto r = decode_bench_batches(spec, w, o, {1, 4});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].weight_bytes, r[1].weight_bytes);
  EXPECT_EQ(r[1].weight_bytes_read - r[0].weight_bytes_read, 3 * 256 * 2);  // three more embedding rows
  EXPECT_EQ(r[1].kv_bytes_read, 4 * r[0].kv_bytes_read);  // same positions, four sequences
  EXPECT_GT(r[1].tokens_per_second, 0.0);
  EXPECT_EQ(r[0].prefill_seconds, r[1].prefill_seconds);  // measured once per load
  EXPECT_THROW(decode_bench_batches(spec, w, o, {}), Error);
}

TEST(DecodeBench, ATiedEmbeddingIsReadWholeAsTheLmHead) {
  ModelSpec spec = testing::qwen25_7b_like(256, 1, 128, 300);
  spec.tie_word_embeddings = true;
  auto w = testing::random_weights(spec, 6);
  const DecodeBenchResult r = decode_bench(spec, w, short_run(2, 3, 1, 0));
  EXPECT_GT(r.weight_bytes, 300 * 256 * 2);
  EXPECT_EQ(r.weight_bytes_read, r.weight_bytes);
}

TEST(DecodeBench, RefusesEmptyOrOverlongRuns) {
  const ModelSpec spec = testing::qwen25_7b_like(256, 1, 128, 300);
  auto w = testing::random_weights(spec, 4);
  DecodeBenchOptions o;
  o.batch = 0;
  EXPECT_THROW(decode_bench(spec, w, o), Error);
  o.batch = 1;
  o.context = spec.max_position_embeddings;
  try {
    decode_bench(spec, w, o);
    FAIL() << "a context past the model's positions was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("exceeds the model's"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardlm
