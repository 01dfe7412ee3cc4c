// Token-by-token generation for one request on a TP × PP group whose ranks
// are threads of this process (LocalComm): `shardlm generate`, tests, bench.
// The driver (tp 0, pp 0) picks each next token from the logits and
// broadcasts it, so every rank runs the same ForwardBatch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

struct GenerateOptions {
  Layout layout;
  int64_t max_tokens = 16;
  std::vector<int64_t> eos_token_ids;  // stop when one is produced (it is kept in the output)
  DType kv_dtype = DType::kF32;
  int64_t block_size = 16;
  int64_t prefill_chunk = 0;  // > 0: prefill the prompt in chunks of this many tokens
  // Picks the next token from logits [vocab_size] on the driver; nullptr = greedy.
  std::function<int32_t(const float* logits, int64_t vocab_size, const std::vector<int32_t>& generated)> pick;
};

struct GenerateResult {
  std::vector<int32_t> tokens;        // generated ids
  std::string finish_reason;          // "length" or "stop"
  std::vector<float> prompt_logits;   // [vocab_size]: the last prompt position (produced tokens[0])
  std::vector<std::vector<float>> step_logits;  // [n_generated][vocab_size] when keep_all_logits
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;        // all steps after the first token
  int64_t weight_bytes_rank0 = 0;     // bytes held by the driver rank
};

// Greedy with the lowest id on ties.
int32_t argmax_token(const float* logits, int64_t vocab_size);

GenerateResult generate_local(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                              const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              bool keep_all_logits = false);

}  // namespace shardlm
