// n-gram speculative decoding in generate: at temperature 0 the tokens are
// bit-identical to decoding without speculation (verification runs k+1 rows
// on the batch-invariant path), on a copy-heavy prompt where drafts are
// accepted (asserted, so the test cannot pass vacuously) and on an ordinary
// one, at TP 1 and TP 2 with uneven heads (7 Q heads: 4 + 3).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "loader/synthetic_checkpoint.h"
#include "model/draft_model.h"
#include "model/generate.h"
#include "model/speculative.h"
#include "plan/memory_budget.h"
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

// The paged draft model serve runs (model/draft_model.h): proposals for
// several sequences computed together equal each one's proposal by a fresh
// draft alone; a later call that extends a context reuses its KV and still
// proposes what a fresh draft would; when its blocks run out it evicts the
// least recently drafted sequence outside the call, and a sequence that
// cannot fit gets no draft. Batch-invariant kernels, so rows of a shared
// step equal a lone sequence's bit for bit.
class PagedDraft : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("shardlm_draft_" + std::to_string(getpid()));
    SyntheticModelOptions o;
    o.like = "qwen2.5-0.5b";
    o.n_layers = 1;
    o.vocab_size = 300;
    o.hidden_size = 64;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.intermediate_size = 128;
    o.seed = 9;
    write_synthetic_model(dir_, o);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  void SetUp() override { backend::set_batch_invariant(true); }
  void TearDown() override { backend::set_batch_invariant(false); }

  static std::unique_ptr<DraftModel> draft(int64_t n_blocks) {
    backend::BackendOptions bo;
    bo.n_threads = 1;
    return std::make_unique<DraftModel>(dir_, 300, backend::make_backend(bo), 64, 4, DType::kF32, n_blocks);
  }
  static std::vector<int32_t> alone(std::span<const int32_t> context, int64_t k) {
    return draft(0)->propose(context, k);
  }
  static std::vector<int32_t> ids(int n, int salt) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(int32_t((i * 37 + salt * 101 + 3) % 300));
    return v;
  }
  // Three sequences (ids 10, 11, 12) drafted for in one call: each gets what it would alone.
  std::vector<std::vector<int32_t>> three_proposals_each_alone(DraftModel& d) {
    const std::vector<int32_t> a = ids(9, 1), b = ids(3, 2), c = ids(14, 3);
    const std::vector<DraftModel::Query> q = {{10, a, 4}, {11, b, 2}, {12, c, 3}};
    auto got = d.propose(q);
    EXPECT_EQ(got.size(), 3u);
    if (got.size() != 3u) return got;
    EXPECT_EQ(got[0], alone(a, 4));
    EXPECT_EQ(got[1], alone(b, 2));
    EXPECT_EQ(got[2], alone(c, 3));
    return got;
  }
  static inline std::filesystem::path dir_;
};

TEST_F(PagedDraft, SharedStepsProposeWhatEachSequenceWouldAlone) {
  const std::vector<int32_t> a = ids(9, 1), b = ids(3, 2);
  auto d = draft(64);
  const auto got = three_proposals_each_alone(*d);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].size(), 4u);
  EXPECT_EQ(d->n_sequences_held(), 3);
  // The next step: a accepted two drafts and produced a token; b took none
  // and produced another. Their KV up to there is kept, the rest fed.
  std::vector<int32_t> a2 = a, b2 = b;
  a2.insert(a2.end(), got[0].begin(), got[0].begin() + 2);
  a2.push_back(7);
  b2.push_back(int32_t((got[1][0] + 1) % 300));
  const std::vector<DraftModel::Query> q2 = {{11, b2, 3}, {10, a2, 3}};
  const auto next = d->propose(q2);
  EXPECT_EQ(next[0], alone(b2, 3));
  EXPECT_EQ(next[1], alone(a2, 3));
  d->release(12);
  EXPECT_EQ(d->n_sequences_held(), 2);
}

// Serve bounds the draft's forward steps (max_num_batched_tokens tokens,
// max_num_seqs sequences): catch-ups longer than a step are fed in chunks,
// sequences past the step's count wait for the next, and the proposals are
// still each sequence's alone. Its step buffers are reserved when it loads:
// what the allocator obtained (and the host logits rows) is plan's
// draft_workspace_bytes for the same bounds, to the byte.
TEST_F(PagedDraft, BoundedStepsProposeTheSameAndReserveWhatPlanCounts) {
  backend::BackendOptions bo;
  bo.n_threads = 1;
  auto d = std::make_unique<DraftModel>(dir_, 300, backend::make_backend(bo), 64, 4, DType::kF32, 64,
                                        /*max_step_tokens=*/5, /*max_step_seqs=*/2);
  MemoryBudgetOptions mo;
  mo.max_num_batched_tokens = 5;
  mo.max_num_seqs = 2;
  EXPECT_EQ(d->workspace_bytes(), draft_workspace_bytes(d->spec(), mo));
  EXPECT_GT(d->workspace_bytes(), 0);
  three_proposals_each_alone(*d);
  // Unbounded (generate): nothing reserved up front.
  EXPECT_EQ(draft(0)->workspace_bytes(), 0);
}

TEST_F(PagedDraft, EvictsTheLeastRecentlyDraftedSequenceOutsideTheCall) {
  // 6 blocks of 4: a 9-token context with 3 drafts needs 3 blocks.
  auto d = draft(6);
  const std::vector<int32_t> a = ids(9, 4), b = ids(9, 5), c = ids(9, 6);
  EXPECT_EQ(d->propose(a, 3).size(), 3u);  // id 0
  const std::vector<DraftModel::Query> qb = {{1, b, 3}};
  EXPECT_EQ(d->propose(qb)[0], alone(b, 3));
  EXPECT_EQ(d->n_sequences_held(), 2);
  // c needs 3 blocks; none free: id 0 (least recent) goes, id 1 stays.
  const std::vector<DraftModel::Query> qc = {{2, c, 3}};
  EXPECT_EQ(d->propose(qc)[0], alone(c, 3));
  EXPECT_EQ(d->n_sequences_held(), 2);
  const std::vector<DraftModel::Query> qb2 = {{1, b, 3}};
  EXPECT_EQ(d->propose(qb2)[0], alone(b, 3));  // id 1's KV was kept
  // Three sequences of 3 blocks in one call cannot all fit in 6: the one
  // that finds no block outside the call gets no draft, the others theirs.
  const std::vector<DraftModel::Query> all = {{0, a, 3}, {1, b, 3}, {2, c, 3}};
  const auto got = d->propose(all);
  int n_empty = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].empty()) {
      ++n_empty;
      continue;
    }
    EXPECT_EQ(got[i], alone(all[i].context, 3)) << i;
  }
  EXPECT_EQ(n_empty, 1);
}

}  // namespace
}  // namespace shardlm
