// MpiGroupExecutor without mpirun: its world is LocalComm threads, so the
// replica split, the batch broadcast, the worker loop, the per-rank byte
// report and the failure path run in-process. (tests/engine/mpi_cli_test.cpp
// runs the same code as OpenMPI processes.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

#include "comm/local_comm.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/mpi_group_executor.h"
#include "loader/synthetic_checkpoint.h"
#include "model/generate.h"
#include "plan/sharding.h"

namespace shardlm {
namespace {

TEST(MpiBatchWire, RoundTripsAndRejectsCutMessages) {
  ForwardBatch b;
  b.token_ids = {5, 6, 7, 8};
  b.seqs.resize(2);
  b.seqs[0] = {3, 0, {4, 9}, true, /*all_logits=*/true};  // prompt logprobs: a row per token
  b.seqs[1] = {1, 17, {1, 2, 3}, false, false, /*long_context=*/true};  // LongRoPE's long factors
  b.seqs[1].local_block_table = {-1, -1, 7, 8, 9};  // a hybrid model's local layers: two released
  const std::vector<int32_t> m = encode_forward_batch(b);
  EXPECT_EQ(m.size(), 3u + 4u + (5u + 2u) + (5u + 3u + 5u));
  ForwardBatch d;
  ASSERT_TRUE(decode_forward_batch(m, &d));
  EXPECT_EQ(d.token_ids, b.token_ids);
  ASSERT_EQ(d.seqs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(d.seqs[i].n_tokens, b.seqs[i].n_tokens);
    EXPECT_EQ(d.seqs[i].n_past, b.seqs[i].n_past);
    EXPECT_EQ(d.seqs[i].block_table, b.seqs[i].block_table);
    EXPECT_EQ(d.seqs[i].local_block_table, b.seqs[i].local_block_table);
    EXPECT_EQ(d.seqs[i].need_logits, b.seqs[i].need_logits);
    EXPECT_EQ(d.seqs[i].all_logits, b.seqs[i].all_logits);
    EXPECT_EQ(d.seqs[i].long_context, b.seqs[i].long_context);
  }
  EXPECT_EQ(d.n_logits(), 3);
  EXPECT_FALSE(decode_forward_batch(encode_shutdown(), &d));
  std::vector<int32_t> cut(m.begin(), m.end() - 1);
  EXPECT_THROW(decode_forward_batch(cut, &d), Error);
  std::vector<int32_t> wrong_sum = m;
  wrong_sum[7] = 2;  // seq 0 claims 2 tokens: 2 + 1 != 4
  EXPECT_THROW(decode_forward_batch(wrong_sum, &d), Error);
  std::vector<int32_t> bad_flags = m;
  bad_flags[9] = 8;  // seq 0's chunk flags: only bits 1, 2 and 4 exist
  EXPECT_THROW(decode_forward_batch(bad_flags, &d), Error);
}

class MpiExecutorThreads : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* build = std::getenv("SHARDLM_BINARY_DIR");
    // One directory per test process: ctest runs this suite's tests in parallel.
    dir_ = std::filesystem::path(build ? build : ".") / ("tests/engine/mpi_executor_model." + std::to_string(getpid()));
    SyntheticModelOptions o;
    o.like = "qwen2.5-7b";  // 28 Q heads, 4 KV heads
    o.n_layers = 3;
    o.vocab_size = 512;
    o.hidden_size = 448;  // head_dim 16
    o.intermediate_size = 512;
    o.seed = 21;
    spec_ = write_synthetic_model(dir_, o).spec;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::filesystem::path dir_;
  static ModelSpec spec_;
};
std::filesystem::path MpiExecutorThreads::dir_;
ModelSpec MpiExecutorThreads::spec_;

struct ReplicaOut {
  GenerateResult result;
  std::vector<RankBytes> bytes;
};

// Every thread builds the executor; each replica's driver runs the token loop.
std::vector<ReplicaOut> run_replicas(const std::filesystem::path& dir, const Layout& layout,
                                     const std::vector<int32_t>& prompt, const GenerateOptions& g) {
  std::vector<ReplicaOut> out(static_cast<size_t>(layout.dp));
  std::mutex mu;
  run_local_ranks(layout.world_size(), [&](Communicator& world) {
    MpiGroupOptions mo;
    mo.model_dir = dir;
    mo.layout = layout;
    mo.n_blocks = generate_kv_blocks(prompt, g);
    mo.block_size = g.block_size;
    mo.kv_dtype = g.kv_dtype;
    mo.n_threads_per_rank = 1;
    MpiGroupExecutor ex(world, mo);
    if (!ex.is_driver()) {
      ex.run_worker();
      return;
    }
    auto step = [&](const ForwardBatch& b, float* logits) { ex.execute(b, logits); };
    GenerateResult r = generate_steps(step, ex.vocab_size(), mo.n_blocks, prompt, g, false, nullptr, true);
    ex.shutdown();
    std::lock_guard<std::mutex> lock(mu);
    out[static_cast<size_t>(ex.replica_index())] = {std::move(r), ex.rank_bytes()};
  });
  return out;
}

TEST_F(MpiExecutorThreads, ReplicasMatchOneRankAndReportPlanBytes) {
  const std::vector<int32_t> prompt = {3, 141, 59, 26, 5, 35};
  GenerateOptions g;
  g.max_tokens = 5;
  g.block_size = 4;
  g.kv_dtype = DType::kF32;
  const GenerateResult want = generate_local(spec_, open_checkpoint(dir_), prompt, g);
  ASSERT_EQ(want.tokens.size(), 5u);
  // TP2 x PP2; TP3 x DP2 (two replicas of three ranks); PP3.
  for (Layout layout : {Layout{2, 2, 1, {}}, Layout{3, 1, 2, {}}, Layout{1, 3, 1, {}}}) {
    const auto got = run_replicas(dir_, layout, prompt, g);
    ASSERT_EQ(got.size(), static_cast<size_t>(layout.dp));
    for (int d = 0; d < layout.dp; ++d) {
      const ReplicaOut& r = got[d];
      EXPECT_EQ(r.result.tokens, want.tokens) << layout.to_string() << " replica " << d;
      ASSERT_EQ(r.result.prompt_logits.size(), want.prompt_logits.size());
      float scale = 1.0f, worst = 0.0f;
      for (size_t i = 0; i < want.prompt_logits.size(); ++i) {
        scale = std::max(scale, std::fabs(want.prompt_logits[i]));
        worst = std::max(worst, std::fabs(r.result.prompt_logits[i] - want.prompt_logits[i]));
      }
      EXPECT_LT(worst / scale, 2e-4f) << layout.to_string();
      // One report per rank of the replica, equal to what plan computes.
      ASSERT_EQ(r.bytes.size(), static_cast<size_t>(layout.tp * layout.pp));
      Layout one = layout;
      one.dp = 1;
      for (size_t i = 0; i < r.bytes.size(); ++i) {
        const RankBytes& b = r.bytes[i];
        EXPECT_EQ(b.world_rank, WorldConfig::rank_of(layout, b.tp_rank, b.pp_rank, d));
        EXPECT_EQ(static_cast<int>(i), b.pp_rank * layout.tp + b.tp_rank);
        EXPECT_EQ(b.weight_bytes, rank_weight_bytes(spec_, one, b.tp_rank, b.pp_rank))
            << layout.to_string() << " tp " << b.tp_rank << " pp " << b.pp_rank;
        EXPECT_GT(b.kv_bytes, 0);
      }
    }
  }
}

// The serving engine over the replica's pipeline: several requests, up to
// PP micro-batches in flight (stage 0 runs batch k+1 while later stages run
// batch k; each stage learns of a batch from the message that precedes its
// input), the tokens of one request at a time on one rank.
std::map<int, std::vector<int32_t>> serve_requests(const std::filesystem::path& dir, const Layout& layout,
                                                   int in_flight, int n_requests) {
  std::map<int, std::vector<int32_t>> got;
  run_local_ranks(layout.world_size(), [&](Communicator& world) {
    MpiGroupOptions mo;
    mo.model_dir = dir;
    mo.layout = layout;
    mo.n_blocks = 64;
    mo.block_size = 4;
    mo.kv_dtype = DType::kF32;
    mo.n_threads_per_rank = 1;
    MpiGroupExecutor ex(world, mo);
    if (!ex.is_driver()) {
      ex.run_worker();
      return;
    }
    EXPECT_EQ(ex.max_in_flight(), layout.pp);
    EngineConfig cfg;
    cfg.scheduler.n_blocks = 64;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_num_batched_tokens = 16;
    cfg.scheduler.max_model_len = 64;
    cfg.max_batches_in_flight = in_flight;
    {
      Engine engine(cfg, ex);
      for (int i = 0; i < n_requests; ++i) {
        EngineRequest r;
        r.request_id = std::to_string(i);
        for (int k = 0; k < 5 + 3 * i; ++k) r.prompt_token_ids.push_back((k * 31 + i * 7 + 2) % 300);
        r.sampling.temperature = 0.0;
        r.stop.max_tokens = 5;
        engine.submit(r, {[&got, i](const SequenceOutput& o) {
          got[i].insert(got[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        }});
      }
      engine.run_until_idle();
    }
    ex.shutdown();
  });
  return got;
}

TEST_F(MpiExecutorThreads, EnginePipelinesMicroBatchesWithTheSameTokens) {
  const auto want = serve_requests(dir_, Layout{1, 1, 1, {}}, 0, 5);
  ASSERT_EQ(want.size(), 5u);
  for (const auto& [i, tokens] : want) EXPECT_EQ(tokens.size(), 5u) << "request " << i;
  EXPECT_EQ(serve_requests(dir_, Layout{1, 3, 1, {}}, 0, 5), want) << "PP3, 3 in flight";
  EXPECT_EQ(serve_requests(dir_, Layout{2, 2, 1, {}}, 0, 5), want) << "TP2 x PP2, 2 in flight";
  EXPECT_EQ(serve_requests(dir_, Layout{1, 2, 1, {}}, 1, 5), want) << "PP2, one batch at a time";
}

TEST_F(MpiExecutorThreads, WorldSizeMustMatchTheLayout) {
  try {
    run_local_ranks(3, [&](Communicator& world) {
      MpiGroupOptions mo;
      mo.model_dir = dir_;
      mo.layout.tp = 2;
      mo.n_blocks = 4;
      MpiGroupExecutor ex(world, mo);
    });
    FAIL() << "a world of 3 ranks ran TP=2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 processes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs 2"), std::string::npos) << e.what();
  }
}

TEST_F(MpiExecutorThreads, ARankFailingItsLoadStopsTheOthersNamingIt) {
  setenv("SHARDLM_TEST_FAIL_RANK", "2", 1);
  try {
    run_local_ranks(3, [&](Communicator& world) {
      MpiGroupOptions mo;
      mo.model_dir = dir_;
      mo.layout.pp = 3;
      mo.n_blocks = 4;
      MpiGroupExecutor ex(world, mo);
      if (!ex.is_driver()) ex.run_worker();
    });
    unsetenv("SHARDLM_TEST_FAIL_RANK");
    FAIL() << "rank 2 failed but the group ran";
  } catch (const Error& e) {
    unsetenv("SHARDLM_TEST_FAIL_RANK");
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
}

// Gemma 3's local layers in their own pool across processes' wire: the
// driver broadcasts the local pool's size with the geometry and every batch
// message carries the local tables (holes included). TP 2 x PP 2 over the
// engine with a 6-block local pool gives generate_local's tokens (one pool
// that keeps everything), and each rank's measured KV bytes are its global
// layers x 64 blocks + its local layers x 6 blocks.
TEST(MpiHybridKv, Gemma3LocalPoolOverTheWire) {
  const char* build = std::getenv("SHARDLM_BINARY_DIR");
  const auto dir = std::filesystem::path(build ? build : ".") / ("tests/engine/mpi_gemma3." + std::to_string(getpid()));
  SyntheticModelOptions o;
  o.like = "gemma-3-1b";
  o.n_layers = 6;
  o.vocab_size = 512;
  o.hidden_size = 320;
  o.n_heads = 4;
  o.n_kv_heads = 1;
  o.head_dim = 64;
  o.intermediate_size = 640;
  o.sliding_window = 5;
  o.tie_word_embeddings = false;
  o.dtype = DType::kF32;
  o.seed = 23;
  const ModelSpec spec = write_synthetic_model(dir, o).spec;
  auto prompt_of = [](int i) {
    std::vector<int32_t> p;
    for (int k = 0; k < 5 + 6 * i; ++k) p.push_back((k * 31 + i * 7 + 2) % 500);
    return p;
  };
  constexpr int kRequests = 4, kMaxTokens = 20;
  std::map<int, std::vector<int32_t>> want, got;
  for (int i = 0; i < kRequests; ++i) {
    GenerateOptions g;
    g.max_tokens = kMaxTokens;
    g.block_size = 4;
    g.kv_dtype = DType::kF32;
    want[i] = generate_local(spec, open_checkpoint(dir), prompt_of(i), g).tokens;
  }
  const Layout layout{2, 2, 1, {}};
  std::vector<RankBytes> bytes;
  int64_t n_local_used_peak = 0;
  run_local_ranks(layout.world_size(), [&](Communicator& world) {
    MpiGroupOptions mo;
    mo.model_dir = dir;
    mo.layout = layout;
    mo.n_blocks = world.rank() == 0 ? 64 : 1;  // the driver's geometry wins
    mo.n_local_blocks = world.rank() == 0 ? 6 : 0;
    mo.block_size = 4;
    mo.kv_dtype = DType::kF32;
    mo.n_threads_per_rank = 1;
    MpiGroupExecutor ex(world, mo);
    if (!ex.is_driver()) {
      ex.run_worker();
      return;
    }
    EngineConfig cfg;
    cfg.scheduler.n_blocks = 64;
    cfg.scheduler.n_local_blocks = 6;
    cfg.scheduler.local_sliding_window = 5;
    cfg.scheduler.block_size = 4;
    cfg.scheduler.max_num_batched_tokens = 8;
    cfg.scheduler.max_model_len = 64;
    {
      Engine engine(cfg, ex);
      for (int i = 0; i < kRequests; ++i) {
        EngineRequest r;
        r.request_id = std::to_string(i);
        r.prompt_token_ids = prompt_of(i);
        r.sampling.temperature = 0.0;
        r.stop.max_tokens = kMaxTokens;
        r.stop.ignore_eos = true;
        engine.submit(r, {[&got, i](const SequenceOutput& out) {
          got[i].insert(got[i].end(), out.new_token_ids.begin(), out.new_token_ids.end());
        }});
      }
      engine.run_until_idle();
      n_local_used_peak = engine.metrics().snapshot().kv_local_blocks_in_use_peak;
    }
    bytes = ex.rank_bytes();
    ex.shutdown();
  });
  std::filesystem::remove_all(dir);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_GT(n_local_used_peak, 0);
  EXPECT_LE(n_local_used_peak, 6);
  ASSERT_EQ(bytes.size(), 4u);
  for (const RankBytes& b : bytes) {
    const RankShard shard = shard_for(spec, layout, b.tp_rank, b.pp_rank);
    int64_t n_local = 0;
    for (int64_t l = shard.layers.begin; l < shard.layers.end; ++l) n_local += spec.is_sliding_layer(l) ? 1 : 0;
    const int64_t n_global = shard.layers.size() - n_local;
    const int64_t per_block = 2 * 1 * 64 * 4 * 4;  // K and V, 1 KV head of 64, f32, 4 slots
    EXPECT_EQ(b.kv_bytes, per_block * (n_global * 64 + n_local * 6)) << "tp " << b.tp_rank << " pp " << b.pp_rank;
  }
}

}  // namespace
}  // namespace shardlm
