// Perplexity of a model on a token sequence, on a TP × PP group of threads:
// what quantization or an fp8/bf16 KV cache costs in quality.
//
// The ids are cut into windows of `context` + 1 tokens that overlap by one
// (window k holds ids[k*context .. (k+1)*context]); each window starts with an
// empty cache and its first token as the prompt, then feeds the true next
// token at every step (teacher forcing through the decode path, so the KV
// cache dtype and every layout are exercised as `generate` runs them). Every
// id but the first is scored once: NLL = -log softmax(logits)[next id], summed
// in double.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

struct PerplexityOptions {
  Layout layout;
  Device device;              // cpu, or the GPU every rank (thread) shares
  int64_t context = 0;        // tokens fed per window; 0: max_position_embeddings
  int64_t max_scored = 0;     // > 0: stop after scoring this many tokens
  DType kv_dtype = DType::kF32;
  int64_t block_size = 16;
};

struct PerplexityResult {
  int64_t n_scored = 0;   // tokens whose probability was measured
  int64_t n_windows = 0;
  double nll_sum = 0.0;   // nats
  double seconds = 0.0;
  std::vector<int32_t> top1;  // [n_scored]: the greedy (argmax) token at each scored position
  double mean_nll() const { return n_scored ? nll_sum / static_cast<double>(n_scored) : 0.0; }
  double perplexity() const;
};

// Throws kInvalidArgument when ids has fewer than 2 tokens, an id is outside
// the vocabulary, or context is outside [1, max_position_embeddings].
PerplexityResult perplexity_local(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                  const std::vector<int32_t>& ids, const PerplexityOptions& options);

}  // namespace shardlm
