// Decode steps through CUDA graphs, the part that is not CUDA: which steps
// qualify, the buffer fingerprint that says when captured graphs went stale,
// and the one line logged when a capture fails. The model (CausalLM) owns
// one per rank when graphs are on; DecodeGraphCache (graph_buckets.h) is the
// per-bucket state machine underneath, and the backend's GraphStepRunner
// (CudaGraphRunner on a GPU, a fake in the CPU tests) does the capturing.
//
// A step qualifies when every sequence decodes one token and wants its
// logits, there are at most max_batch of them, and no context is longer
// than max_context (the bound the attention is sized by in graph steps).
// Such a step is padded to its bucket (StepMetadata::add_padding_rows) and
// run through the cache: eager warm-up, capture, then replays.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/device/graph_buckets.h"

namespace shardlm::backend {

// Graphs bigger than this are not captured by default: the batch sizes the
// GPU check measures (1, 8, 64) and vLLM's smallest buckets, with the
// attention workspace of the largest bucket kept to tens of MiB.
constexpr int64_t kDefaultGraphMaxBatch = 64;

struct DecodeGraphOptions {
  bool enabled = false;
  int64_t max_batch = kDefaultGraphMaxBatch;  // the largest bucket (>= 1)
  int64_t max_context = 0;                    // the longest context a graph step may have (>= 1)
};

// --cuda-graphs on|off for a device ("" = the device's default: on for a
// GPU, off on the CPU). Throws kInvalidArgument for another value, and for
// "on" with a CPU device (the CPU has no graphs: its ops run as called).
bool parse_cuda_graphs_flag(const std::string& value, bool device_is_gpu);

// Why a step runs without a graph.
enum class GraphSkip { kNone, kOff, kNotAllDecode, kTooManyRows, kContextTooLong };
const char* graph_skip_name(GraphSkip skip);
// n_seqs sequences; all_decode_with_logits: each has one new token and
// need_logits; max_context: the longest n_past + 1 among them.
GraphSkip graph_skip_reason(const DecodeGraphOptions& options, int64_t n_seqs, bool all_decode_with_logits,
                            int64_t max_context);

// Every device address a captured step baked in (activation buffers, the KV
// pool, the logits), plus the backend's buffer_epoch(). Captured graphs are
// good while the key stays the same.
struct GraphBufferKey {
  std::vector<const void*> addresses;
  uint64_t backend_epoch = 0;
  bool operator==(const GraphBufferKey&) const = default;
};

class DecodeGraphs {
 public:
  // runner: the backend's (not null). log: receives each line worth logging
  // (a failed capture, once per bucket).
  DecodeGraphs(DecodeGraphOptions options, std::unique_ptr<GraphStepRunner> runner,
               std::function<void(const std::string&)> log);

  // The bucket a qualifying step pads to, or -1 when it runs eagerly as it is.
  int bucket_for(int64_t n_seqs, bool all_decode_with_logits, int64_t max_context) const;
  // Runs one step already padded to `bucket` rows, whose buffers are `key`:
  // when the key differs from the one the graphs were captured with, every
  // graph is dropped first (and recaptured after its warm-up).
  GraphAction run(int bucket, const GraphBufferKey& key);
  // Drops every graph (the KV cache or weights moved).
  void invalidate();

  const DecodeGraphOptions& options() const { return options_; }
  const DecodeGraphCache& cache() const { return cache_; }
  int64_t n_invalidations() const { return n_invalidations_; }
  // "on: decode batches 1 to 64 in 11 buckets (1 2 4 8 16 ... 64), contexts up to 4096 tokens".
  std::string describe() const;

 private:
  DecodeGraphOptions options_;
  std::unique_ptr<GraphStepRunner> runner_;
  std::function<void(const std::string&)> log_;
  DecodeGraphCache cache_;
  GraphBufferKey key_;
  bool have_key_ = false;
  int64_t n_invalidations_ = 0;
  std::set<int> failures_logged_;
};

}  // namespace shardlm::backend
