// Grammar masks of new states, computed off the engine thread.
//
// A constrained sequence's mask is a copy when its grammar state was seen
// before, but a new state walks the whole vocabulary, and a large enum or
// choice grammar builds new DFA states all along that walk: 0.3-2.6 s for
// one mask, measured. Computed in the step, that stalled every running
// request. Instead, when a sampled token leads a sequence to a state whose
// mask is not cached, the engine posts the mask here and holds the sequence
// out of its plans (Scheduler::set_held); the other sequences step on. When
// the job is done, the engine releases the sequence and uses the mask.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grammar/compiled_grammar.h"

namespace shardlm {

struct PendingMask {
  int32_t state = 0;             // the grammar state whose mask this is
  std::vector<uint32_t> mask;    // [n_mask_words] once done (without stop ids)
  std::string error;             // why it failed (the grammar's table budget), once done
  std::atomic<bool> done{false};
  std::atomic<bool> cancelled{false};  // its sequence ended: stop the walk
};

class MaskWorker {
 public:
  // on_done runs on the worker's thread after each job; it must not block.
  // before_job (tests) runs before each job, on the worker's thread.
  explicit MaskWorker(std::function<void()> on_done, std::function<void()> before_job = {});
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Queues the mask of `state`; the thread starts with the first job.
  std::shared_ptr<PendingMask> post(std::shared_ptr<const grammar::CompiledGrammar> grammar, int32_t state);

 private:
  struct Job {
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
    std::shared_ptr<PendingMask> pending;
  };
  void work();

  const std::function<void()> on_done_;
  const std::function<void()> before_job_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace shardlm
