// CUDA graphs for decode steps, host-side bookkeeping (no CUDA here, so it is
// unit-tested on CPU). A decode step of n sequences runs the graph captured
// for the smallest bucket >= n, its padding rows masked; a step larger than
// the largest bucket, or any prefill, runs eagerly.
//
// Each bucket moves through: kEmpty → (warm-up steps, run eagerly so lazy
// initialisation such as cuBLASLt workspaces and heuristics happens outside
// the capture) → kCapturing → kReady (replayed from then on). A capture that
// fails marks the bucket kFailed with its reason: that bucket runs eagerly
// for good, and the reason is reported (never a silent slowdown). Anything
// that moves device pointers a graph baked in (the KV pool reallocated,
// weights reloaded) calls invalidate(): every bucket returns to kEmpty.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::backend {

// vLLM's capture sizes: 1, 2, 4, then every multiple of 8 up to max_batch
// (max_batch itself is always a bucket). max_batch must be >= 1.
std::vector<int> default_graph_buckets(int max_batch);

// The smallest bucket >= n_seqs, or -1 when n_seqs exceeds every bucket (or
// n_seqs < 1). buckets: ascending, distinct, each >= 1.
int choose_graph_bucket(const std::vector<int>& buckets, int n_seqs);

// What the state machine needs from a device: each call runs a decode step
// padded to `bucket` rows (run_eager with the real n_seqs when no bucket
// fits). begin/end_capture bracket a stream capture of one step; end_capture
// throws when the capture or the instantiation fails. replay launches the
// instantiated graph of that bucket.
class GraphStepRunner {
 public:
  virtual ~GraphStepRunner() = default;
  virtual void run_eager(int n_rows) = 0;
  virtual void begin_capture(int bucket) = 0;
  virtual void end_capture(int bucket) = 0;
  virtual void abandon_capture(int bucket) noexcept = 0;  // after a throw between begin and end
  virtual void replay(int bucket) = 0;
  // Drops every captured graph (with DecodeGraphCache::invalidate()).
  virtual void clear() noexcept {}
};

enum class GraphState { kEmpty, kCapturing, kReady, kFailed };
const char* graph_state_name(GraphState state);

enum class GraphAction { kEager, kCaptureThenReplay, kReplay };

class DecodeGraphCache {
 public:
  // buckets as for choose_graph_bucket; warmup_steps eager steps per bucket before its capture.
  DecodeGraphCache(std::vector<int> buckets, int warmup_steps = 1);

  // What step(n_seqs) would do now (no side effects).
  GraphAction plan(int n_seqs) const;
  // Runs one decode step of n_seqs sequences through runner, capturing or
  // replaying as the bucket's state says; returns what it did.
  GraphAction step(int n_seqs, GraphStepRunner& runner);
  // Every bucket back to kEmpty (failed ones too: the cause may be gone).
  void invalidate();

  const std::vector<int>& buckets() const { return buckets_; }
  GraphState state(int bucket) const;
  const std::string& failure(int bucket) const;  // "" unless kFailed
  int64_t n_replays() const { return n_replays_; }
  int64_t n_captures() const { return n_captures_; }
  int64_t n_eager() const { return n_eager_; }

 private:
  struct Slot {
    GraphState state = GraphState::kEmpty;
    int warmups_done = 0;
    std::string failure;
  };
  int index_of(int bucket) const;

  std::vector<int> buckets_;
  std::vector<Slot> slots_;
  int warmup_steps_;
  int64_t n_replays_ = 0, n_captures_ = 0, n_eager_ = 0;
};

}  // namespace shardlm::backend
