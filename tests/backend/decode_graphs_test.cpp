// Decode steps through graphs, the host side (no CUDA): the padding of a
// step's metadata to its bucket, which steps qualify, the --cuda-graphs
// flag, and DecodeGraphs over a fake runner: warm-up, capture, replay, the
// invalidation when a buffer moved, and the eager fallback (one logged line)
// when a capture fails.
#include <gtest/gtest.h>

#include <stdexcept>

#include "backend/device/decode_graphs.h"
#include "backend/step_metadata.h"
#include "core/error.h"

namespace shardlm::backend {
namespace {

// Hybrid models: the local layers' tables ride after the others in the packed
// buffer (whose earlier offsets do not move) and seqs(1) reads them.
TEST(StepMetadataLocalTables, SeqsOfGroupOneReadTheLocalTables) {
  StepMetadata m;
  const std::vector<int32_t> ids0{1, 2, 3}, t0{3, 4}, l0{-1, 9}, t1{7}, l1{6};
  const int32_t b = 12;
  m.add_seq(ids0, 4, t0, 1, StepMetadata::kNoLongRope, l0);
  m.add_seq({&b, 1}, 2, t1, 1, StepMetadata::kNoLongRope, l1);
  m.add_padding_rows(1);
  m.finish();
  ASSERT_EQ(m.n_seqs(), 3);
  EXPECT_EQ(m.block_tables_offset(), 2 * 5 + 3 + 5 * 3);
  EXPECT_EQ(m.packed().size(), size_t(m.block_tables_offset()) + 3 + 3);
  for (int g : {0, 1}) {
    const AttentionSeq* s = m.seqs(g);
    EXPECT_EQ(s[0].n_past, 4);
    EXPECT_EQ(s[0].n_tokens, 3);
    EXPECT_EQ(s[1].token_begin, 3);
    EXPECT_EQ(s[2].n_tokens, 0);  // padding
    EXPECT_EQ(s[2].n_table, 0);
  }
  EXPECT_EQ(std::vector<int32_t>(m.seqs(0)[0].block_table, m.seqs(0)[0].block_table + 2), t0);
  EXPECT_EQ(std::vector<int32_t>(m.seqs(1)[0].block_table, m.seqs(1)[0].block_table + 2), l0);
  EXPECT_EQ(m.seqs(1)[1].n_table, 1);
  EXPECT_EQ(m.seqs(1)[1].block_table[0], 6);
  EXPECT_EQ(m.seqs(), m.seqs(0));
  // Without local tables seqs(1) has chunks with empty tables (a kernel refuses them).
  StepMetadata plain;
  plain.add_seq(ids0, 0, t0, 1);
  plain.finish();
  EXPECT_EQ(plain.seqs(1)[0].n_table, 0);
}

TEST(StepMetadataPadding, PadsDecodeRowsToTheBucket) {
  StepMetadata m;
  const std::vector<int32_t> t0{3, 4}, t1{7};
  const int32_t a = 11, b = 12;
  m.add_seq({&a, 1}, 20, t0, true);
  m.add_seq({&b, 1}, 5, t1, true);
  m.add_padding_rows(2);
  m.finish();
  EXPECT_EQ(m.n_tokens(), 4);
  EXPECT_EQ(m.n_seqs(), 4);
  EXPECT_EQ(m.n_logits(), 4);
  EXPECT_EQ(m.n_padding(), 2);
  const std::vector<int32_t> ids(m.token_ids(), m.token_ids() + 4), pos(m.positions(), m.positions() + 4),
      rows(m.logit_rows(), m.logit_rows() + 4);
  EXPECT_EQ(ids, (std::vector<int32_t>{11, 12, 0, 0}));
  EXPECT_EQ(pos, (std::vector<int32_t>{20, 5, 0, 0}));
  EXPECT_EQ(rows, (std::vector<int32_t>{0, 1, 2, 3}));
  // Records: (token_begin, n_tokens, n_past, table_offset, n_table); padding has no tokens and no table.
  const int32_t* r = m.packed().data() + m.seq_records_offset();
  EXPECT_EQ(std::vector<int32_t>(r, r + 20),
            (std::vector<int32_t>{0, 1, 20, 0, 2, 1, 1, 5, 2, 1, 2, 0, 0, 0, 0, 3, 0, 0, 0, 0}));
  EXPECT_EQ(m.block_tables_offset(), 3 * 4 + 5 * 4);  // depends on the bucket alone
  EXPECT_EQ(m.packed().size(), static_cast<size_t>(m.block_tables_offset() + 3));
  EXPECT_EQ(m.seqs()[2].n_tokens, 0);
  EXPECT_EQ(m.seqs()[3].token_begin, 3);
  // The next step starts unpadded.
  m.clear();
  m.add_seq({&a, 1}, 21, t0, true);
  m.finish();
  EXPECT_EQ(m.n_tokens(), 1);
  EXPECT_EQ(m.n_padding(), 0);
}

TEST(CudaGraphsFlag, OnForGpusOffOnCpuAndRefusedWhereItCannotWork) {
  EXPECT_TRUE(parse_cuda_graphs_flag("", true));
  EXPECT_FALSE(parse_cuda_graphs_flag("", false));
  EXPECT_TRUE(parse_cuda_graphs_flag("on", true));
  EXPECT_FALSE(parse_cuda_graphs_flag("off", true));
  EXPECT_FALSE(parse_cuda_graphs_flag("off", false));
  try {
    parse_cuda_graphs_flag("on", false);
    FAIL() << "on for the CPU must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a GPU"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_cuda_graphs_flag("yes", true), Error);
}

TEST(DecodeGraphDecision, OnlyDecodeStepsThatFit) {
  DecodeGraphOptions o{true, 8, 100};
  EXPECT_EQ(graph_skip_reason(o, 3, true, 50), GraphSkip::kNone);
  EXPECT_EQ(graph_skip_reason(o, 8, true, 100), GraphSkip::kNone);
  EXPECT_EQ(graph_skip_reason(o, 9, true, 50), GraphSkip::kTooManyRows);
  EXPECT_EQ(graph_skip_reason(o, 3, false, 50), GraphSkip::kNotAllDecode);  // a prefill chunk in the batch
  EXPECT_EQ(graph_skip_reason(o, 3, true, 101), GraphSkip::kContextTooLong);
  EXPECT_EQ(graph_skip_reason(o, 0, true, 1), GraphSkip::kNotAllDecode);
  o.enabled = false;
  EXPECT_EQ(graph_skip_reason(o, 3, true, 50), GraphSkip::kOff);
}

// Records calls; capture records without running, as a stream capture does.
struct State {
  std::vector<std::string> calls;
  int fail_capture_of = -1;
  int n_clears = 0;
};
struct FakeRunner : GraphStepRunner {
  explicit FakeRunner(State* s) : s(s) {}
  State* s;
  bool capturing = false;
  void run_eager(int n) override { s->calls.push_back((capturing ? "record " : "eager ") + std::to_string(n)); }
  void begin_capture(int) override { capturing = true; }
  void end_capture(int b) override {
    capturing = false;
    if (b == s->fail_capture_of) throw std::runtime_error("operation not permitted when stream is capturing");
  }
  void abandon_capture(int) noexcept override { capturing = false; }
  void replay(int b) override { s->calls.push_back("replay " + std::to_string(b)); }
  void clear() noexcept override { ++s->n_clears; }
};

TEST(DecodeGraphs, BucketsWarmUpCaptureReplayAndInvalidateWhenABufferMoves) {
  State st;
  std::vector<std::string> log;
  DecodeGraphs g({true, 8, 64}, std::make_unique<FakeRunner>(&st), [&](const std::string& l) { log.push_back(l); });
  EXPECT_EQ(g.bucket_for(3, true, 10), 4);
  EXPECT_EQ(g.bucket_for(9, true, 10), -1);
  EXPECT_EQ(g.bucket_for(3, true, 65), -1);
  GraphBufferKey key{{reinterpret_cast<const void*>(0x1000)}, 0};
  EXPECT_EQ(g.run(4, key), GraphAction::kEager);               // warm-up
  EXPECT_EQ(g.run(4, key), GraphAction::kCaptureThenReplay);   // capture, then the step itself
  EXPECT_EQ(g.run(4, key), GraphAction::kReplay);
  EXPECT_EQ(st.calls, (std::vector<std::string>{"eager 4", "record 4", "replay 4", "replay 4"}));
  EXPECT_EQ(st.n_clears, 0);
  // The activation buffer moved (a larger prefill regrew it): every graph goes.
  key.addresses[0] = reinterpret_cast<const void*>(0x2000);
  EXPECT_EQ(g.run(4, key), GraphAction::kEager);
  EXPECT_EQ(st.n_clears, 1);
  EXPECT_EQ(g.n_invalidations(), 1);
  EXPECT_EQ(g.run(4, key), GraphAction::kCaptureThenReplay);
  // So does a regrown backend scratch.
  key.backend_epoch = 7;
  EXPECT_EQ(g.run(4, key), GraphAction::kEager);
  EXPECT_EQ(g.n_invalidations(), 2);
  EXPECT_TRUE(log.empty());
  EXPECT_NE(g.describe().find("1 to 8 in 4 buckets (1 2 4 8), contexts up to 64"), std::string::npos) << g.describe();
  EXPECT_THROW(g.run(3, key), Error);  // not a bucket
}

TEST(DecodeGraphs, AFailedCaptureRunsEagerlyAndIsLoggedOnce) {
  State st;
  st.fail_capture_of = 2;
  std::vector<std::string> log;
  DecodeGraphs g({true, 4, 64}, std::make_unique<FakeRunner>(&st), [&](const std::string& l) { log.push_back(l); });
  const GraphBufferKey key;
  EXPECT_EQ(g.run(2, key), GraphAction::kEager);
  EXPECT_EQ(g.run(2, key), GraphAction::kEager);  // the capture failed: the step ran for real
  EXPECT_EQ(g.run(2, key), GraphAction::kEager);
  EXPECT_EQ(g.run(1, key), GraphAction::kEager);  // other buckets are unaffected
  EXPECT_EQ(g.run(1, key), GraphAction::kCaptureThenReplay);
  EXPECT_EQ(st.calls, (std::vector<std::string>{"eager 2", "record 2", "eager 2", "eager 2", "eager 1", "record 1",
                                                "replay 1"}));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_NE(log[0].find("batch 2 failed (operation not permitted"), std::string::npos) << log[0];
  EXPECT_EQ(g.cache().state(2), GraphState::kFailed);
}

TEST(DecodeGraphs, RefusesBadOptions) {
  State st;
  EXPECT_THROW(DecodeGraphs({true, 0, 64}, std::make_unique<FakeRunner>(&st), {}), Error);
  EXPECT_THROW(DecodeGraphs({true, 4, 0}, std::make_unique<FakeRunner>(&st), {}), Error);
  EXPECT_THROW(DecodeGraphs({true, 4, 64}, nullptr, {}), Error);
}

}  // namespace
}  // namespace shardlm::backend
