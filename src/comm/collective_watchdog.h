// Waiting for a device collective without ever hanging. NCCL enqueues a
// collective on a stream and returns at once; a dead or stuck peer shows up
// later as an asynchronous error on the communicator (ncclCommGetAsyncError)
// or never. NcclComm therefore waits by polling "is the stream done? has the
// communicator failed?" until a deadline, and on an error or a timeout aborts
// the communicator and throws Error(kDistributed) naming this rank, the world
// size and the operation. The polling loop lives here, behind an interface, so
// its error paths are unit-tested on CPU with a fake.
#pragma once

#include <chrono>
#include <string>

namespace shardlm {

enum class CollectivePollResult { kDone, kPending, kFailed };

class CollectiveProbe {
 public:
  virtual ~CollectiveProbe() = default;
  // kFailed sets *error to what the library said (e.g. "remote process exited").
  virtual CollectivePollResult poll(std::string* error) = 0;
  // Tears the communicator down so nothing waits on it any more (ncclCommAbort). Never throws.
  virtual void abort() noexcept = 0;
};

// What is waited for, for messages: "all_reduce_sum(bf16, 4096 elements)".
struct CollectiveOp {
  int rank = 0;
  int world_size = 1;
  std::string what;
};

// The default deadline of one collective: 300 s, or $SHARDLM_COLLECTIVE_TIMEOUT_S
// (a positive number of seconds; anything else throws Error(kInvalidArgument)
// naming the variable). Long enough for a first NCCL connection setup.
std::chrono::milliseconds collective_timeout_from_env();

// Polls probe until kDone. On kFailed, or when timeout passes first, calls
// probe.abort() and throws Error(kDistributed):
//   "rank 3 of 6: all_gather(f32, 12 elements) failed: <error>"
//   "rank 3 of 6: all_gather(f32, 12 elements) did not complete within 2.5 s ..."
// The poll interval starts at 0 (a collective usually finishes within
// microseconds) and backs off to 1 ms so a long wait does not burn a core.
void wait_for_collective(CollectiveProbe& probe, const CollectiveOp& op, std::chrono::milliseconds timeout);

}  // namespace shardlm
