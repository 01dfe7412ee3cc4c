// Heap traffic of decode steps on the real model path (engine, scheduler,
// LocalGroupExecutor, CausalLM, CPU backend, sampler): after warm-up, no
// step allocates a buffer the size of a logits row or more. Small
// bookkeeping allocations (plan vectors, output events) are counted and
// printed, not forbidden: the test catches buffers that scale with the
// vocabulary or the activations. This binary replaces the global operator
// new to count; no other test binary does.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>

#include "engine/engine.h"
#include "engine/local_group_executor.h"
#include "random_weights.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_n_allocs{0};
std::atomic<int64_t> g_bytes{0};
std::atomic<int64_t> g_largest{0};

void* counted_alloc(std::size_t n, std::size_t align) {
  if (g_counting.load(std::memory_order_relaxed)) {
    g_n_allocs.fetch_add(1, std::memory_order_relaxed);
    g_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
    int64_t prev = g_largest.load(std::memory_order_relaxed);
    while (static_cast<int64_t>(n) > prev && !g_largest.compare_exchange_weak(prev, static_cast<int64_t>(n))) {
    }
  }
  void* p = align > alignof(std::max_align_t) ? std::aligned_alloc(align, (n + align - 1) / align * align)
                                              : std::malloc(n == 0 ? 1 : n);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, 0); }
void* operator new[](std::size_t n) { return counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace shardlm {
namespace {

TEST(StepAllocations, DecodeStepsAllocateNoRowSizedBuffers) {
  constexpr int64_t kVocab = 8192;  // a logits row: 32 KiB
  ModelSpec spec = testing::qwen25_7b_like(256, 2, 512, kVocab);
  auto weights = testing::random_weights(spec, 5);
  LocalGroupOptions gopt;
  gopt.n_blocks = 128;
  gopt.block_size = 4;
  gopt.kv_dtype = DType::kF32;
  gopt.n_threads_per_rank = 1;
  LocalGroupExecutor executor(spec, weights, gopt);
  EngineConfig cfg;
  cfg.scheduler.n_blocks = 128;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.max_model_len = 128;
  Engine engine(cfg, executor);

  constexpr int kRequests = 4;
  constexpr int kWarmup = 6;    // tokens per sequence before counting
  constexpr int kCounted = 20;  // decode steps counted
  std::map<int, int> n_tokens;
  int64_t n_steps_counted = 0;
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    r.request_id = std::to_string(i);
    for (int k = 0; k < 10 + i; ++k) r.prompt_token_ids.push_back(int32_t((k * 131 + i * 17) % kVocab));
    // Greedy, sampled (top_p: the selection path), top_k and penalties.
    if (i == 1) r.sampling = SamplingParams{.temperature = 0.8, .top_p = 0.9, .seed = 3};
    if (i == 2) r.sampling = SamplingParams{.temperature = 0.7, .top_k = 40, .seed = 4};
    if (i == 3) r.sampling = SamplingParams{.temperature = 1.0, .min_p = 0.05, .seed = 5};
    if (i == 0) r.sampling.temperature = 0.0;
    r.stop.max_tokens = kWarmup + kCounted + 4;
    engine.submit(r, {[&, i](const SequenceOutput& o) {
      n_tokens[i] += static_cast<int>(o.new_token_ids.size());
      if (i != 0) return;  // request 0 paces the window: one token per decode step
      if (n_tokens[0] == kWarmup) g_counting = true;
      if (g_counting && n_tokens[0] > kWarmup) ++n_steps_counted;
      if (n_tokens[0] == kWarmup + kCounted) g_counting = false;
    }});
  }
  engine.run_until_idle();
  g_counting = false;
  ASSERT_EQ(n_steps_counted, kCounted);
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(n_tokens[i], kWarmup + kCounted + 4) << i;
  std::printf("decode steps: %lld, allocations per step: %.1f, bytes per step: %.0f, largest: %lld B (row: %lld B)\n",
              static_cast<long long>(n_steps_counted), double(g_n_allocs) / double(n_steps_counted),
              double(g_bytes) / double(n_steps_counted), static_cast<long long>(g_largest.load()),
              static_cast<long long>(kVocab * 4));
  EXPECT_LT(g_largest.load(), kVocab * 4) << "a decode step allocated a buffer the size of a logits row or more";
}

}  // namespace
}  // namespace shardlm
