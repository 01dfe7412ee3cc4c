// Sampling on the device: a [n_rows, vocab] logits matrix never crosses to
// the host; only the chosen ids, their logprobs and the requested top
// logprobs come back. Semantics follow sampling/sampler.cpp (vLLM's):
// penalties (repetition on prompt+output tokens, presence/frequency on output
// counts) → temperature (greedy below kGreedyTemperature, lowest id on ties)
// → min-p → top-k → top-p → a draw. Logprobs are raw: log_softmax of the
// model's logits before any processing.
//
// Differences from the CPU sampler, stated: top-k and top-p cut at a
// probability threshold found by bisection (30 steps on log p) instead of a sort, so
// tokens tied exactly at the cut are all kept; the draw uses Philox
// (curand) seeded with (seed, step), so seeded runs repeat on the GPU but
// give other tokens than the CPU's generator.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shardlm::backend::cuda {

struct DeviceSamplingRow {
  float temperature = 1.0f;
  int32_t top_k = -1;          // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t n_logprobs = 0;      // top alternatives wanted, <= kMaxDeviceLogprobs
  uint64_t seed = 0;
  uint64_t step = 0;           // tokens this sequence has drawn so far (Philox offset)
};

constexpr int kMaxDeviceLogprobs = 20;

// Penalty inputs per row, CSR: row r's entries are [offsets[r], offsets[r+1]),
// each a distinct token with its count in the output so far and whether it
// occurs in the prompt.
struct DevicePenalties {
  const int32_t* offsets = nullptr;    // [n_rows + 1]
  const int32_t* tokens = nullptr;     // [n_entries]
  const int32_t* out_counts = nullptr; // [n_entries]
  const uint8_t* in_prompt = nullptr;  // [n_entries]
};

// logits: [n_rows, vocab] f32 (read only); work: [n_rows, vocab] f32 scratch;
// rows: [n_rows]; out_ids, out_logprobs: [n_rows];
// top_ids, top_logprobs: [n_rows, kMaxDeviceLogprobs] (entries past a row's n_logprobs are -1 / 0).
void sample(const float* logits, int64_t n_rows, int64_t vocab, const DeviceSamplingRow* rows,
            const DevicePenalties& penalties, float* work, int32_t* out_ids, float* out_logprobs, int32_t* top_ids,
            float* top_logprobs, cudaStream_t stream);

}  // namespace shardlm::backend::cuda
