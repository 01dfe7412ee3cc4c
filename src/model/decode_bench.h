// Decode (and prefill) throughput of a layout on a device: `batch` sequences that each
// already hold `context` tokens of KV cache, stepped one token at a time,
// the way the engine runs a decode step (logits of every sequence come back
// to the host). For `shardlm generate --decode-bench B` and the GPU check,
// which sets the result beside the HBM roofline: a decode step reads every
// weight once and each sequence's KV cache, so bytes_per_step ÷ the
// device's copy bandwidth bounds the step time from below.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/device/decode_graphs.h"
#include "core/tensor.h"
#include "loader/model_spec.h"
#include "model/weight_source.h"
#include "plan/sharding.h"

namespace shardlm {

struct DecodeBenchOptions {
  Layout layout;
  Device device;
  int64_t batch = 1;
  int64_t context = 256;    // cached tokens per sequence before the first timed step
  int64_t n_steps = 32;     // timed steps
  int64_t n_warmup = 3;     // untimed steps first
  DType kv_dtype = DType::kBF16;
  int64_t block_size = 16;
  backend::DecodeGraphOptions graphs;  // enabled: CUDA graphs (max_batch and max_context are filled in)
  bool batch_invariant = false;        // time the batch-invariant kernels (--batch-invariant)
};

struct DecodeBenchResult {
  double seconds = 0.0;          // the timed steps
  int64_t n_steps = 0;
  double tokens_per_second = 0.0;  // batch × n_steps / seconds
  int64_t weight_bytes = 0;      // every rank's weights (measured by its allocator or mapped)
  // The weight bytes a step reads, every rank: weight_bytes less an embedding
  // table that is not the lm_head (untied, or beside a quantized lm_head),
  // of which a step reads one row per sequence.
  int64_t weight_bytes_read = 0;
  int64_t kv_bytes_read = 0;     // KV bytes the timed steps read, mean per step (every rank)
  int64_t graph_replays = 0;     // steps of this batch the driver replayed from a graph (timed and warm-up)
  std::string graphs;            // the driver's "CUDA graphs: ..." line ("" when not asked for)
  // One sequence's prefill of `context` tokens, timed once after an untimed
  // one (the same for every batch of a load: it is measured before them).
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0.0;
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prefill_tokens / prefill_seconds : 0.0; }
  int64_t bytes_per_step() const { return weight_bytes_read + kv_bytes_read; }
};

// Throws kInvalidArgument for batch, context or steps < 1, or a context that
// exceeds the model's; what run_rank_group throws for the device.
DecodeBenchResult decode_bench(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                               const DecodeBenchOptions& options);
// The same for several batch sizes over one load of the model (options.batch
// is ignored; the KV cache is sized for the largest). One result per batch, in order.
std::vector<DecodeBenchResult> decode_bench_batches(const ModelSpec& spec, std::shared_ptr<const WeightSource> weights,
                                                    const DecodeBenchOptions& options,
                                                    const std::vector<int64_t>& batches);

}  // namespace shardlm
