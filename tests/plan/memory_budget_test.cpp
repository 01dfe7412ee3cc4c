// MemoryBudget, device catalog and vLLM rules against hand-computed numbers.
// Every expected value below is worked out in the comment from config.json
// shapes, not taken from the code's output.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loader/model_catalog.h"
#include "plan/device_catalog.h"
#include "kv/block_table.h"
#include "plan/memory_budget.h"
#include "plan/vllm_rules.h"

namespace shardlm {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

TEST(MemoryBudget, WholeModelKvPerToken) {
  // Qwen2.5-72B: 2 (K,V) × 8 KV heads × 128 head_dim × 2 bytes × 80 layers = 327,680.
  EXPECT_EQ(model_kv_bytes_per_token(catalog_model_spec("qwen2.5-72b"), KvCacheDType::kAuto), 327680);
  // Qwen2.5-7B: 2 × 4 × 128 × 2 × 28 = 57,344; fp8 halves it: 28,672.
  ModelSpec q7 = catalog_model_spec("qwen2.5-7b");
  EXPECT_EQ(model_kv_bytes_per_token(q7, KvCacheDType::kAuto), 57344);
  EXPECT_EQ(model_kv_bytes_per_token(q7, KvCacheDType::kFp8), 28672);
  // Same at TP=PP=1 through the per-rank path.
  EXPECT_EQ(rank_kv_bytes_per_token(q7, Layout{}, 0, 0, KvCacheDType::kBF16), 57344);
}

TEST(MemoryBudget, Qwen72bWeightsMatchTheOfficialIndexTotal) {
  // metadata.total_size of Qwen2.5-72B-Instruct's model.safetensors.index.json.
  EXPECT_EQ(rank_weight_bytes(catalog_model_spec("qwen2.5-72b"), Layout{}, 0, 0), 145412407296LL);
}

TEST(MemoryBudget, Qwen7bAtTp6PerRankByHand) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  const Layout tp6{6, 1, 1, {}};
  // h = 3584, head_dim 128. 28 Q heads over 6 ranks: 5,5,5,5,4,4; 7 Q heads per KV head, so
  // rank 0 (Q 0-4) holds KV head 0; rank 1 (Q 5-9) KV 0-1; rank 4 (Q 20-23) KV 2-3.
  // MLP 18944 in units of 16 = 1184 units over 6: 198,198,197,197,197,197 → 3168 or 3152 columns.
  // Vocab 152064 = 9504 × 16 over 6: 25344 rows each for embed_tokens and lm_head (both on the one stage).
  // Per layer, elements: norms 2·3584 = 7,168; q_proj q·128·3584 + bias q·128; k,v 2·(kv·128·3584 + kv·128);
  // o_proj 3584·q·128; MLP 3·cols·3584.
  //  rank 0 (q=5, kv=1, 3168): 7,168 + 2,293,760 + 640 + 917,760 + 2,293,760 + 34,062,336 = 39,575,424
  //  rank 1 (q=5, kv=2, 3168): 7,168 + 2,293,760 + 640 + 1,835,520 + 2,293,760 + 34,062,336 = 40,493,184
  //  rank 4 (q=4, kv=2, 3152): 7,168 + 1,835,008 + 512 + 1,835,520 + 1,835,008 + 33,890,304 = 39,403,520
  // + 28 layers, + embed and lm_head 2 · 25,344 · 3,584 = 181,665,792, + final norm 3,584; × 2 bytes:
  //  rank 0: (39,575,424·28 + 181,665,792 + 3,584) · 2 = 2,579,562,496
  //  rank 1: (40,493,184·28 + 181,665,792 + 3,584) · 2 = 2,630,957,056
  //  rank 4: (39,403,520·28 + 181,665,792 + 3,584) · 2 = 2,569,935,872
  const int64_t mem = 40536 * kMiB;
  MemoryBudgetOptions o;  // 0.9, 8192 batched tokens, 8 seqs, auto KV, 16-token blocks, 1 GiB reserve
  EXPECT_EQ(compute_memory_budget(spec, tp6, 0, 0, mem, o).weight_bytes, 2579562496LL);
  EXPECT_EQ(compute_memory_budget(spec, tp6, 1, 0, mem, o).weight_bytes, 2630957056LL);
  EXPECT_EQ(compute_memory_budget(spec, tp6, 4, 0, mem, o).weight_bytes, 2569935872LL);
  // KV per token per rank: 2 × kv heads × 128 × 2 bytes × 28 layers: 1 head → 14,336; 2 heads → 28,672.
  EXPECT_EQ(compute_memory_budget(spec, tp6, 0, 0, mem, o).kv_bytes_per_token, 14336);
  EXPECT_EQ(compute_memory_budget(spec, tp6, 1, 0, mem, o).kv_bytes_per_token, 28672);

  // Rank 0's whole budget on an A100-40GB (40,536 MiB = 42,505,076,736 B):
  //  budget    = floor(42,505,076,736 × 0.9) = 38,254,569,062
  //  workspace (f32 activations) = hidden 3·8192·3584·4 = 352,321,536
  //            + attention 8192·(2·5+2·1)·128·4 = 50,331,648 + mlp 2·8192·3168·4 = 207,618,048
  //            + logits 8·3584·4 + 8·152064·4 + 8·25344·4 + 8·152064·4 = 10,657,792
  //            + sampler 2·8·152064·4 = 9,732,096                                 → 630,661,120
  //  usable    = 38,254,569,062 − 2,579,562,496 − 630,661,120 − 1,073,741,824 = 33,970,603,622
  //  blocks    = floor(33,970,603,622 / (14,336 · 16 = 229,376)) = 148,100 → 2,369,600 tokens
  const MemoryBudget b = compute_memory_budget(spec, tp6, 0, 0, mem, o);
  EXPECT_EQ(b.budget_bytes, 38254569062LL);
  EXPECT_EQ(b.workspace.hidden, 352321536);
  EXPECT_EQ(b.workspace.attention, 50331648);
  EXPECT_EQ(b.workspace.mlp, 207618048);
  EXPECT_EQ(b.workspace.reduce, 0);
  EXPECT_EQ(b.workspace.logits, 10657792);
  EXPECT_EQ(b.workspace.sampler, 9732096);
  EXPECT_EQ(b.workspace_bytes, 630661120);
  EXPECT_EQ(b.usable_bytes, 33970603622LL);
  EXPECT_EQ(b.n_kv_blocks, 148100);
  EXPECT_EQ(b.n_kv_tokens, 2369600);
  EXPECT_EQ(b.kv_cache_bytes, 148100LL * 229376);
  EXPECT_TRUE(b.fits());
}

TEST(MemoryBudget, TokensThatFitOnOneDevice) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  MemoryBudgetOptions o;
  // 24 GiB = 25,769,803,776 B; × 0.9 → 23,192,823,398.
  // Workspace at TP=1: hidden 352,321,536 + attention 8192·(56+8)·128·4 = 268,435,456
  // + mlp 2·8192·18944·4 = 1,241,513,984 + logits 8·3584·4 + 8·152064·4 = 4,980,736
  // + sampler 9,732,096 → 1,876,983,808.
  // usable = 23,192,823,398 − 15,231,233,024 − 1,876,983,808 − 1,073,741,824 = 5,010,864,742
  // bf16: / (57,344 · 16 = 917,504) = 5,461 blocks = 87,376 tokens.
  // fp8:  / (28,672 · 16 = 458,752) = 10,922 blocks = 174,752 tokens.
  const int64_t mem = 24LL << 30;
  MemoryBudget b = compute_memory_budget(spec, Layout{}, 0, 0, mem, o);
  EXPECT_EQ(b.usable_bytes, 5010864742LL);
  EXPECT_EQ(b.n_kv_blocks, 5461);
  EXPECT_EQ(b.n_kv_tokens, 87376);
  o.kv_cache_dtype = KvCacheDType::kFp8;
  EXPECT_EQ(compute_memory_budget(spec, Layout{}, 0, 0, mem, o).n_kv_tokens, 174752);
  // 16 GiB: 15,461,882,265 budget < 15.2 GB weights + workspace + reserve: no blocks, negative usable.
  b = compute_memory_budget(spec, Layout{}, 0, 0, 16LL << 30, o);
  EXPECT_FALSE(b.fits());
  EXPECT_LT(b.usable_bytes, 0);
  EXPECT_EQ(b.n_kv_tokens, 0);
  // CPU serve passes its pool and no reserve: 64 GiB × 1.0 − weights − workspace.
  o.gpu_memory_utilization = 1.0;
  o.reserve_bytes = 0;
  b = compute_memory_budget(spec, Layout{}, 0, 0, 64LL << 30, o);
  EXPECT_EQ(b.usable_bytes, (64LL << 30) - 15231233024LL - 1876983808LL);
}

TEST(MemoryBudget, ReplicaHoldsItsTightestRank) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  const Layout tp2{2, 1, 1, {}};
  // Rank 0 on 80 GiB, rank 1 on 40 GiB: the replica holds what rank 1 holds.
  auto budgets = compute_replica_budgets(spec, tp2, {80LL << 30, 40LL << 30}, MemoryBudgetOptions{});
  ASSERT_EQ(budgets.size(), 2u);
  EXPECT_GT(budgets[0].n_kv_blocks_capacity, budgets[1].n_kv_blocks_capacity);
  // Both ranks allocate the tighter rank's blocks: the pool serve builds.
  EXPECT_EQ(budgets[0].n_kv_blocks, budgets[1].n_kv_blocks_capacity);
  EXPECT_EQ(budgets[1].n_kv_blocks, budgets[1].n_kv_blocks_capacity);
  EXPECT_EQ(replica_kv_tokens(budgets), budgets[1].n_kv_blocks_capacity * 16);
  EXPECT_EQ(budgets[0].kv_cache_bytes, budgets[0].n_kv_blocks * budgets[0].kv_block_bytes);
  EXPECT_THROW(compute_replica_budgets(spec, tp2, {1, 2, 3}, MemoryBudgetOptions{}), Error);
}

TEST(MemoryBudget, PipelineStagesHoldTheirLayersKv) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-7b");
  Layout pp2{1, 2, 1, {10, 18}};
  // KV per token per stage: 2 × 4 × 128 × 2 × layers: 10 → 20,480; 18 → 36,864.
  EXPECT_EQ(rank_kv_bytes_per_token(spec, pp2, 0, 0, KvCacheDType::kAuto), 20480);
  EXPECT_EQ(rank_kv_bytes_per_token(spec, pp2, 0, 1, KvCacheDType::kAuto), 36864);
  MemoryBudgetOptions o;
  // Only the last stage carries logits and the sampler; stages send the residual stream itself.
  EXPECT_EQ(compute_memory_budget(spec, pp2, 0, 0, 40LL << 30, o).workspace.logits, 0);
  EXPECT_EQ(compute_memory_budget(spec, pp2, 0, 0, 40LL << 30, o).workspace.sampler, 0);
  EXPECT_GT(compute_memory_budget(spec, pp2, 0, 1, 40LL << 30, o).workspace.sampler, 0);
  EXPECT_EQ(compute_memory_budget(spec, pp2, 0, 0, 40LL << 30, o).workspace.pipeline, 0);
}

TEST(MemoryBudget, RejectsBadOptionsWithTheFlagName) {
  const ModelSpec spec = catalog_model_spec("qwen2.5-0.5b");
  MemoryBudgetOptions o;
  o.gpu_memory_utilization = 1.5;
  try {
    compute_memory_budget(spec, Layout{}, 0, 0, 1LL << 30, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-memory-utilization"), std::string::npos);
  }
  o = MemoryBudgetOptions{};
  o.max_num_batched_tokens = 0;
  EXPECT_THROW(compute_memory_budget(spec, Layout{}, 0, 0, 1LL << 30, o), Error);
  EXPECT_THROW(compute_memory_budget(spec, Layout{2, 1, 1, {}}, 2, 0, 1LL << 30, MemoryBudgetOptions{}), Error);
}

TEST(MemoryBudget, JsonCarriesEveryField) {
  const auto b = compute_memory_budget(catalog_model_spec("qwen2.5-0.5b"), Layout{}, 0, 0, 8LL << 30, MemoryBudgetOptions{});
  const auto j = memory_budget_json(b);
  for (const char* k : {"weight_bytes", "kv_bytes_per_token", "workspace_bytes", "reserve_bytes", "kv_cache_bytes",
                        "n_kv_blocks", "n_kv_tokens", "usable_bytes", "budget_bytes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["n_kv_tokens"].get<int64_t>(), b.n_kv_tokens);
}

TEST(KvDtype, Parses) {
  KvCacheDType d;
  ASSERT_TRUE(parse_kv_cache_dtype("fp8", &d));
  EXPECT_EQ(kv_dtype_size(d, DType::kBF16), 1u);
  ASSERT_TRUE(parse_kv_cache_dtype("auto", &d));
  EXPECT_EQ(kv_dtype_size(d, DType::kF32), 4u);
  EXPECT_FALSE(parse_kv_cache_dtype("int4", &d));
}

TEST(DeviceCatalog, ParsesGroupsAndMemorySizes) {
  DeviceInventory inv = parse_device_inventory("6xA100-40GB");
  ASSERT_EQ(inv.n_devices(), 6);
  EXPECT_EQ(inv.devices[0].memory_bytes, 40536 * kMiB);  // nvidia-smi's 40,536 MiB, not 40e9
  EXPECT_DOUBLE_EQ(inv.devices[0].memory_bandwidth, 1555e9);
  inv = parse_device_inventory("6x24GiB");
  EXPECT_EQ(inv.devices[5].memory_bytes, 24LL << 30);
  EXPECT_TRUE(inv.devices[5].assumed);
  inv = parse_device_inventory("4x80GB");
  EXPECT_EQ(inv.devices[0].memory_bytes, 80000000000LL);
  inv = parse_device_inventory("2xA100-80GB, 2xa100_40gb", 2);
  ASSERT_EQ(inv.n_devices(), 4);
  EXPECT_EQ(inv.devices[1].name, "A100-80GB");
  EXPECT_EQ(inv.devices[2].name, "A100-40GB");
  EXPECT_EQ(inv.node_of(1), 0);
  EXPECT_EQ(inv.node_of(2), 1);
  EXPECT_EQ(inv.describe(), "2x A100-80GB + 2x A100-40GB over 2 hosts");
  EXPECT_NE(find_device("h200"), nullptr);
  EXPECT_NE(find_device("RTX4090"), nullptr);
}

TEST(DeviceCatalog, BadInputNamesTheGroupAndTheCatalog) {
  auto expect = [](const std::string& text, int nodes, const std::string& needle) {
    try {
      parse_device_inventory(text, nodes);
      ADD_FAILURE() << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect("6xB300", 1, "unknown device \"B300\"");
  expect("6xB300", 1, "A100-40GB");
  expect("A100", 1, "no COUNTx prefix");
  expect("0xA100-40GB", 1, "no devices");
  expect("6xA100-40GB", 4, "--nodes 4 does not divide the 6 devices");
  expect("6x24XB", 1, "unknown device");
}

// vLLM's verdict for a table of (model, tp), each reason worked out by hand.
TEST(VllmRules, VerdictTable) {
  struct Case {
    const char* model;
    int tp;
    bool accepted;
    const char* reason;
  };
  const std::vector<Case> cases = {
      // Qwen2.5-7B: 28 Q heads, 4 KV heads, MLP 18944.
      {"qwen2.5-7b", 1, true, ""},
      {"qwen2.5-7b", 2, true, ""},
      {"qwen2.5-7b", 4, true, ""},
      {"qwen2.5-7b", 3, false, "Total number of attention heads (28) must be divisible by tensor parallel size (3)."},
      {"qwen2.5-7b", 6, false, "Total number of attention heads (28) must be divisible by tensor parallel size (6)."},
      // 28 % 7 == 0 but 7 > 4 KV heads and 7 % 4 = 3: the replication assert.
      {"qwen2.5-7b", 7, false, "AssertionError: assert tp_size % self.total_num_kv_heads == 0"},
      {"qwen2.5-7b", 8, false, "Total number of attention heads (28) must be divisible by tensor parallel size (8)."},
      // Qwen2.5-14B: 40 Q heads, 8 KV heads. 40 % 5 == 0, but 5 <= 8 and 8 % 5 = 3: the partition assert.
      {"qwen2.5-14b", 5, false, "AssertionError: assert self.total_num_kv_heads % tp_size == 0"},
      {"qwen2.5-14b", 8, true, ""},
      // 40 % 10 == 0; 10 > 8 and 10 % 8 = 2.
      {"qwen2.5-14b", 10, false, "AssertionError: assert tp_size % self.total_num_kv_heads == 0"},
      // Qwen2.5-32B also has 40 attention heads.
      {"qwen2.5-32b", 6, false, "Total number of attention heads (40) must be divisible by tensor parallel size (6)."},
      {"qwen2.5-32b", 5, false, "AssertionError: assert self.total_num_kv_heads % tp_size == 0"},
      // Qwen2.5-0.5B: 14 heads, 2 KV heads, MLP 4864. TP 14: heads and KV pass (14 % 2 = 0) but
      // gate_up_proj's 2 × 4864 = 9728 = 14 × 694 + 12.
      {"qwen2.5-0.5b", 14, false, "AssertionError: 9728 is not divisible by 14"},
      {"qwen2.5-0.5b", 2, true, ""},
      // Llama-3.1-70B: 64 heads, 8 KV heads; TP 16 replicates each KV head twice.
      {"llama-3.1-70b", 16, true, ""},
      {"llama-3.1-70b", 6, false, "Total number of attention heads (64) must be divisible by tensor parallel size (6)."},
  };
  for (const auto& c : cases) {
    const VllmVerdict v = vllm_check_layout(catalog_model_spec(c.model), Layout{c.tp, 1, 1, {}});
    EXPECT_EQ(v.accepted, c.accepted) << c.model << " tp=" << c.tp;
    EXPECT_EQ(v.reason, c.reason) << c.model << " tp=" << c.tp;
  }
  EXPECT_EQ(catalog_model_spec("qwen2.5-32b").n_heads, 40);
}

TEST(VllmRules, PipelinePartitionGivesTheRemainderToStagesBeforeTheLast) {
  EXPECT_EQ(vllm_pp_partition(48, 3), (std::vector<int64_t>{16, 16, 16}));  // 48 = 3 × 16
  EXPECT_EQ(vllm_pp_partition(28, 3), (std::vector<int64_t>{9, 10, 9}));    // 28 = 3 × 9 + 1 → partitions[-2]
  EXPECT_EQ(vllm_pp_partition(64, 3), (std::vector<int64_t>{21, 22, 21}));  // 64 = 3 × 21 + 1
  EXPECT_EQ(vllm_pp_partition(80, 3), (std::vector<int64_t>{27, 27, 26}));  // 80 = 3 × 26 + 2 → [-2], [-3]
  EXPECT_EQ(vllm_pp_partition(28, 6), (std::vector<int64_t>{4, 5, 5, 5, 5, 4}));  // 28 = 6 × 4 + 4
  EXPECT_EQ(vllm_pp_partition(5, 1), (std::vector<int64_t>{5}));
}

}  // namespace

// KV per layer type (issue #22). Gemma 3 1B: 1 KV head × 256 × bf16 = 1,024
// bytes per token per layer for K and V; layers 5, 11, 17, 23 are global.
TEST(KvLayerTypes, Gemma3OneBSplitsGlobalAndLocalLayers) {
  const ModelSpec g = catalog_model_spec("gemma-3-1b");
  const KvLayerTypes t = kv_layer_types(g, KvCacheDType::kAuto);
  EXPECT_EQ(t.n_global_layers, 4);
  EXPECT_EQ(t.n_local_layers, 22);
  EXPECT_EQ(t.window, 512);
  EXPECT_EQ(t.global_bytes_per_token, 4096);
  EXPECT_EQ(t.local_bytes_per_token, 22528);
  EXPECT_EQ(t.global_bytes_per_token + t.local_bytes_per_token, model_kv_bytes_per_token(g, KvCacheDType::kAuto));
  EXPECT_EQ(kv_layer_types(g, KvCacheDType::kFp8).local_bytes_per_token, 11264);
  // Its global layers share the blocks: the cache frees nothing, a sequence holds its whole context.
  EXPECT_EQ(cache_sliding_window(g), 0);
  EXPECT_EQ(kv_tokens_per_sequence(g, 32768, 16, 2048), 32768);
  EXPECT_EQ(max_context_for_pool(g, 20000, 16, 2048), 20000);
  // No sliding layer at all (Mistral v0.3: sliding_window null).
  const KvLayerTypes m = kv_layer_types(catalog_model_spec("mistral-7b"), KvCacheDType::kAuto);
  EXPECT_EQ(m.n_local_layers, 0);
  EXPECT_EQ(m.window, 0);
  EXPECT_EQ(m.global_bytes_per_token, 131072);
}

// Gemma 3 1B's two pools per rank: the local layers' sized first,
// 4 sequences × (ceil(511 / 16) + 2) + 2,048 / 16 = 264 blocks of 16 ×
// 22,528 B = 95,158,272 B; the global layers' pool the rest at 4,096 B per
// token. Models whose layers all slide or none slide keep one pool.
TEST(KvLayerTypes, Gemma3LocalLayersGetAPoolOfTheirOwn) {
  const ModelSpec g = catalog_model_spec("gemma-3-1b");
  MemoryBudgetOptions o;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 2048;
  o.block_size = 16;
  o.reserve_bytes = 0;
  o.gpu_memory_utilization = 1.0;
  EXPECT_EQ(local_pool_window(g), 512);
  EXPECT_EQ(local_pool_blocks(g, o), 264);
  // One sequence's local bound never exceeds the pool: ceil((511 + 2,048) / 16) + 1 = 161.
  EXPECT_EQ(max_blocks_held(32768, 16, 512, 2048), 161);
  const MemoryBudget b = compute_memory_budget(g, Layout{}, 0, 0, int64_t{8} << 30, o);
  EXPECT_EQ(b.local_kv_bytes_per_token, 22528);
  EXPECT_EQ(b.kv_bytes_per_token, 4096);
  EXPECT_EQ(b.n_local_kv_blocks, 264);
  EXPECT_EQ(b.local_kv_block_bytes, 360448);
  EXPECT_EQ(b.local_kv_cache_bytes, 95158272);
  EXPECT_EQ(b.kv_block_bytes, 65536);
  EXPECT_EQ(b.n_kv_blocks_capacity, (b.usable_bytes - 95158272) / 65536);
  EXPECT_EQ(b.kv_cache_bytes, b.n_kv_blocks * 65536 + 95158272);
  EXPECT_LE(b.kv_cache_bytes, b.usable_bytes);
  // PP 26 stages, one layer each: a local-only stage's main pool is unbounded, the global ones bind.
  Layout pp;
  pp.pp = 26;
  const std::vector<MemoryBudget> r = compute_replica_budgets(g, pp, {int64_t{2} << 30}, o);
  EXPECT_EQ(r[0].kv_block_bytes, 0);
  EXPECT_EQ(r[0].n_kv_blocks_capacity, kUnboundedBlocks);
  EXPECT_EQ(r[5].kv_block_bytes, 16 * 1024);  // layer 5 is global
  EXPECT_EQ(r[0].n_kv_blocks, r[5].n_kv_blocks);
  EXPECT_LT(r[5].n_kv_blocks, kUnboundedBlocks);
  EXPECT_EQ(r[0].kv_cache_bytes, 264 * 16 * 1024);  // its local pool only
  // Short memory: the local pool never gets more blocks than the global one
  // (a sequence holds a local block only where it holds the global block).
  // 64 MiB usable / (65,536 + 360,448) = 157 blocks each, below the cap of 264.
  MemoryBudgetOptions tight = o;
  const MemoryBudget t0 = compute_memory_budget(g, Layout{}, 0, 0, int64_t{8} << 30, tight);
  const int64_t fixed = t0.weight_bytes + t0.workspace_bytes;
  const MemoryBudget t = compute_memory_budget(g, Layout{}, 0, 0, fixed + (int64_t{64} << 20), tight);
  EXPECT_EQ(t.usable_bytes, int64_t{64} << 20);
  EXPECT_EQ(t.n_local_kv_blocks_max, 264);
  EXPECT_EQ(t.n_local_kv_blocks, 157);
  EXPECT_EQ(t.n_kv_blocks, (67108864 - 157 * 360448) / 65536);  // 160
  EXPECT_GE(t.n_kv_blocks, t.n_local_kv_blocks);
  EXPECT_EQ(t.kv_cache_bytes, t.n_kv_blocks * 65536 + 157 * 360448);
  // Not one block for both: nothing fits.
  const MemoryBudget none = compute_memory_budget(g, Layout{}, 0, 0, fixed + 400000, tight);
  EXPECT_EQ(none.n_local_kv_blocks, 0);
  EXPECT_FALSE(none.fits());
  // One pool: none sliding (Mistral v0.3) or all (Phi-3-mini-4k).
  for (const char* name : {"mistral-7b", "phi-3-mini-4k"}) {
    const ModelSpec m = catalog_model_spec(name);
    EXPECT_EQ(local_pool_window(m), 0) << name;
    EXPECT_EQ(local_pool_blocks(m, o), 0) << name;
    const MemoryBudget mb = compute_memory_budget(m, Layout{}, 0, 0, int64_t{40} << 30, o);
    EXPECT_EQ(mb.local_kv_cache_bytes, 0) << name;
    EXPECT_EQ(mb.kv_bytes_per_token, model_kv_bytes_per_token(m, KvCacheDType::kAuto)) << name;
  }
}

// Every layer slides (Phi-3-mini-4k: window 2,047 of 4,096 positions): a
// sequence holds only its window's blocks and one chunk's, so a pool smaller
// than one whole context still serves the model's full length.
TEST(KvLayerTypes, EveryLayerSlidingBoundsASequencesBlocks) {
  const ModelSpec p = catalog_model_spec("phi-3-mini-4k");
  EXPECT_EQ(cache_sliding_window(p), 2047);
  const KvLayerTypes t = kv_layer_types(p, KvCacheDType::kAuto);
  EXPECT_EQ(t.n_global_layers, 0);
  EXPECT_EQ(t.n_local_layers, 32);
  // ceil((2047 - 1 + 512) / 16) + 1 = 161 blocks of 16.
  EXPECT_EQ(kv_tokens_per_sequence(p, 4096, 16, 512), 2576);
  EXPECT_EQ(kv_tokens_per_sequence(p, 1000, 16, 512), 1008);  // shorter than the bound: its own blocks
  EXPECT_EQ(kv_tokens_per_sequence(p, 4096, 16, 8192), 4096);  // a chunk that covers it all
  EXPECT_EQ(max_context_for_pool(p, 2576, 16, 512), 4096);
  EXPECT_EQ(max_context_for_pool(p, 2560, 16, 512), 2560);  // one block short: only what it holds whole
  EXPECT_THROW(kv_tokens_per_sequence(p, 4096, 16, 0), Error);
}

}  // namespace shardlm
