#include "comm/collective_watchdog.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <thread>

#include "core/error.h"

namespace shardlm {

std::chrono::milliseconds collective_timeout_from_env() {
  const char* text = std::getenv("SHARDLM_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return std::chrono::milliseconds(300'000);
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0.0) || seconds > 1e6)
    fail(ErrorCode::kInvalidArgument, "SHARDLM_COLLECTIVE_TIMEOUT_S='", text,
         "' is not a number of seconds in (0, 1000000]; unset it for the default of 300");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

void wait_for_collective(CollectiveProbe& probe, const CollectiveOp& op, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  const std::string who = str_cat("rank ", op.rank, " of ", op.world_size, ": ", op.what);
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    std::string error;
    CollectivePollResult r;
    try {
      r = probe.poll(&error);
    } catch (const std::exception& e) {
      probe.abort();
      fail(ErrorCode::kDistributed, who, " failed: ", e.what());
    }
    if (r == CollectivePollResult::kDone) return;
    if (r == CollectivePollResult::kFailed) {
      probe.abort();
      fail(ErrorCode::kDistributed, who, " failed: ", error.empty() ? "unknown error" : error,
           "; the communicator was aborted (the other ranks stop too)");
    }
    if (Clock::now() >= deadline) {
      probe.abort();
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(timeout.count()) / 1000.0);
      fail(ErrorCode::kDistributed, who, " did not complete within ", secs,
           " s: a peer rank is dead, stuck or never called it; the communicator was aborted. "
           "NCCL_DEBUG=WARN names the failing link; SHARDLM_COLLECTIVE_TIMEOUT_S sets the limit");
    }
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
    pause = pause.count() == 0 ? std::chrono::microseconds(10)
                               : std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace shardlm
