// n-gram speculative decoding in generate: at temperature 0 the tokens are
// bit-identical to decoding without speculation (verification runs k+1 rows
// on the batch-invariant path), on a copy-heavy prompt where drafts are
// accepted (asserted, so the test cannot pass vacuously) and on an ordinary
// one, at TP 1 and TP 2 with uneven heads (7 Q heads: 4 + 3).
#include <gtest/gtest.h>

#include "backend/cpu/ops.h"
#include "model/generate.h"
#include "model/speculative.h"
#include "random_weights.h"

namespace shardlm {
namespace {

ModelSpec spec_for_speculation() {
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, 384);
  spec.n_heads = 7;
  spec.n_kv_heads = 1;
  spec.head_dim = 32;
  return spec;
}

GenerateResult run(const std::vector<int32_t>& prompt, int tp, bool speculate) {
  const ModelSpec spec = spec_for_speculation();
  GenerateOptions opt;
  opt.layout.tp = tp;
  opt.max_tokens = 24;
  opt.kv_dtype = DType::kF32;
  opt.block_size = 4;
  opt.batch_invariant = true;  // the reference: plain decoding on the same kernels
  if (speculate) opt.speculative = {4, 2, 4};
  GenerateResult r = generate_local(spec, testing::random_weights(spec, 5), prompt, opt);
  backend::set_batch_invariant(false);
  return r;
}

TEST(NgramDraft, ProposesWhatFollowedTheLongestEarlierMatch) {
  const SpeculativeOptions so{3, 2, 3};
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 2, 3}, so, 8), (std::vector<int32_t>{4, 5, 9}));
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 2, 3}, so, 2), (std::vector<int32_t>{4, 5}));
  EXPECT_TRUE(ngram_draft(std::vector<int32_t>{1, 2, 3, 4}, so, 8).empty());  // no 2-gram repeats
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{7, 8, 1, 7, 8, 2, 7, 8}, so, 8), (std::vector<int32_t>{2, 7, 8}));  // most recent match
  // A run of one token: the overlapping match at s = suffix-1 gives 1 token; an older one gives k.
  EXPECT_EQ(ngram_draft(std::vector<int32_t>{4, 4, 4, 4, 4, 4}, so, 8), (std::vector<int32_t>{4, 4, 4}));
}

void expect_identical(int tp) {
  std::vector<int32_t> copy_heavy;
  for (int rep = 0; rep < 4; ++rep)
    for (int32_t t : {17, 93, 201, 5, 66, 140, 33}) copy_heavy.push_back(t);
  std::vector<int32_t> ordinary;
  for (int k = 0; k < 13; ++k) ordinary.push_back(int32_t((k * 71 + 19) % 384));
  int64_t accepted_total = 0;
  for (const auto& prompt : {copy_heavy, ordinary}) {
    const GenerateResult plain = run(prompt, tp, false);
    const GenerateResult spec = run(prompt, tp, true);
    EXPECT_EQ(spec.tokens, plain.tokens) << "TP " << tp << ", prompt of " << prompt.size();
    EXPECT_EQ(spec.finish_reason, plain.finish_reason);
    EXPECT_LE(spec.speculative.n_accepted_tokens, spec.speculative.n_draft_tokens);
    EXPECT_EQ(plain.speculative.n_drafts, 0);
    accepted_total += spec.speculative.n_accepted_tokens;
    if (&prompt == &copy_heavy) {
      EXPECT_GT(spec.speculative.n_drafts, 0);
    }
  }
  EXPECT_GT(accepted_total, 0) << "TP " << tp << ": no draft was accepted; the identity above proved nothing";
}

TEST(Speculative, NgramGreedyTokensIdenticalTp1) { expect_identical(1); }
TEST(Speculative, NgramGreedyTokensIdenticalTp2UnevenHeads) { expect_identical(2); }

}  // namespace
}  // namespace shardlm
