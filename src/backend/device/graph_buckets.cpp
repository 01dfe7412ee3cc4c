#include "backend/device/graph_buckets.h"

#include <algorithm>
#include <exception>

#include "core/error.h"

namespace shardlm::backend {

std::vector<int> default_graph_buckets(int max_batch) {
  if (max_batch < 1) fail(ErrorCode::kInvalidArgument, "CUDA graph buckets: max batch ", max_batch, " must be >= 1");
  std::vector<int> out;
  for (int b : {1, 2, 4})
    if (b <= max_batch) out.push_back(b);
  for (int b = 8; b <= max_batch; b += 8) out.push_back(b);
  if (out.back() != max_batch) out.push_back(max_batch);
  return out;
}

int choose_graph_bucket(const std::vector<int>& buckets, int n_seqs) {
  if (n_seqs < 1) return -1;
  auto it = std::lower_bound(buckets.begin(), buckets.end(), n_seqs);
  return it == buckets.end() ? -1 : *it;
}

const char* graph_state_name(GraphState state) {
  switch (state) {
    case GraphState::kEmpty: return "empty";
    case GraphState::kCapturing: return "capturing";
    case GraphState::kReady: return "ready";
    case GraphState::kFailed: return "failed";
  }
  return "?";
}

DecodeGraphCache::DecodeGraphCache(std::vector<int> buckets, int warmup_steps)
    : buckets_(std::move(buckets)), slots_(buckets_.size()), warmup_steps_(warmup_steps) {
  if (warmup_steps < 0) fail(ErrorCode::kInvalidArgument, "CUDA graph warm-up steps ", warmup_steps, " must be >= 0");
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (buckets_[i] < 1 || (i > 0 && buckets_[i] <= buckets_[i - 1]))
      fail(ErrorCode::kInvalidArgument, "CUDA graph buckets must be ascending, distinct and >= 1; bucket ", i,
           " is ", buckets_[i]);
  }
}

int DecodeGraphCache::index_of(int bucket) const {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), bucket);
  if (it == buckets_.end() || *it != bucket) return -1;
  return static_cast<int>(it - buckets_.begin());
}

GraphState DecodeGraphCache::state(int bucket) const {
  int i = index_of(bucket);
  if (i < 0) fail(ErrorCode::kInvalidArgument, "CUDA graph bucket ", bucket, " does not exist");
  return slots_[i].state;
}

const std::string& DecodeGraphCache::failure(int bucket) const {
  int i = index_of(bucket);
  if (i < 0) fail(ErrorCode::kInvalidArgument, "CUDA graph bucket ", bucket, " does not exist");
  return slots_[i].failure;
}

GraphAction DecodeGraphCache::plan(int n_seqs) const {
  int bucket = choose_graph_bucket(buckets_, n_seqs);
  if (bucket < 0) return GraphAction::kEager;
  const Slot& s = slots_[index_of(bucket)];
  switch (s.state) {
    case GraphState::kReady: return GraphAction::kReplay;
    case GraphState::kEmpty:
      return s.warmups_done >= warmup_steps_ ? GraphAction::kCaptureThenReplay : GraphAction::kEager;
    case GraphState::kCapturing:  // only if a previous capture threw past us: treat as failed
    case GraphState::kFailed: return GraphAction::kEager;
  }
  return GraphAction::kEager;
}

GraphAction DecodeGraphCache::step(int n_seqs, GraphStepRunner& runner) {
  const GraphAction action = plan(n_seqs);
  const int bucket = choose_graph_bucket(buckets_, n_seqs);
  switch (action) {
    case GraphAction::kEager:
      // Warm-up steps run padded to the bucket so they touch what the capture will.
      runner.run_eager(bucket < 0 ? n_seqs : bucket);
      ++n_eager_;
      if (bucket >= 0) {
        Slot& s = slots_[index_of(bucket)];
        if (s.state == GraphState::kEmpty) ++s.warmups_done;
      }
      return action;
    case GraphAction::kReplay:
      runner.replay(bucket);
      ++n_replays_;
      return action;
    case GraphAction::kCaptureThenReplay: {
      Slot& s = slots_[index_of(bucket)];
      s.state = GraphState::kCapturing;
      try {
        runner.begin_capture(bucket);
        runner.run_eager(bucket);  // recorded, not executed
        runner.end_capture(bucket);
      } catch (const std::exception& e) {
        runner.abandon_capture(bucket);
        s.state = GraphState::kFailed;
        s.failure = e.what();
        // The step still has to happen: run it for real.
        runner.run_eager(bucket);
        ++n_eager_;
        return GraphAction::kEager;
      }
      s.state = GraphState::kReady;
      ++n_captures_;
      // Capturing records the work without executing it; the step runs now.
      runner.replay(bucket);
      ++n_replays_;
      return action;
    }
  }
  return action;
}

void DecodeGraphCache::invalidate() {
  for (Slot& s : slots_) s = Slot{};
}

}  // namespace shardlm::backend
