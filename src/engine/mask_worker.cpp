#include "engine/mask_worker.h"

#include <exception>

namespace shardlm {

MaskWorker::MaskWorker(std::function<void()> on_done, std::function<void()> before_job)
    : on_done_(std::move(on_done)), before_job_(std::move(before_job)) {}

MaskWorker::~MaskWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    for (Job& j : jobs_) j.pending->cancelled = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<PendingMask> MaskWorker::post(std::shared_ptr<const grammar::CompiledGrammar> grammar, int32_t state) {
  auto pending = std::make_shared<PendingMask>();
  pending->state = state;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back({std::move(grammar), pending});
    if (!thread_.joinable()) thread_ = std::thread([this] { work(); });
  }
  cv_.notify_one();
  return pending;
}

void MaskWorker::work() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    PendingMask& p = *job.pending;
    if (before_job_) before_job_();
    if (!p.cancelled) {
      try {
        p.mask.assign(size_t(job.grammar->vocabulary().n_mask_words()), 0u);
        job.grammar->fill_mask(p.state, p.mask, [&p] { return p.cancelled.load(); });
      } catch (const std::exception& e) {
        p.error = e.what();
      }
    }
    p.done = true;
    on_done_();
  }
}

}  // namespace shardlm
