// Connections waiting for their next request head, on one epoll thread.
//
// A connection holds a worker thread only while one of its requests is
// served. Before its first request, and between requests on a kept-alive
// connection, it waits here, costing a file descriptor and a few bytes: a
// client slow to send its head (slowloris), or a thousand idle keep-alive
// connections, cannot take the workers that normal requests need.
//
// Each wake-up peeks at the receive buffer (the head stays there for
// httplib) and asks judge_head (server/request_gate.h) for a verdict;
// SO_RCVLOWAT makes epoll sleep until more bytes than were judged arrive, so
// an incomplete head costs no wake-ups. Deadlines:
//   - a new connection: start_timeout to its first byte, then head_timeout
//     to its blank line; either missed gets 408;
//   - a kept-alive connection: keep_alive_timeout of silence closes it
//     without a word (HTTP's idle close), a started head then head_timeout;
//   - a body is waited for here too, for body_timeout after its head, so
//     that a request reaches a worker whole and a trickled body holds no
//     thread. One of up to kMaxWaitedBody bytes (and within half the receive
//     buffer, what SO_RCVLOWAT can wait for) waits in the kernel's receive
//     buffer. A larger one (or one sent after `Expect: 100-continue`, which
//     the waiter answers) is read, head and body, into memory: at most
//     max_buffered_body_bytes over all connections, past which a connection
//     is left unread (TCP's window holds its client back) until bytes free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/request_gate.h"

namespace shardlm::server {

class HeadWaiter {
 public:
  static constexpr size_t kMaxWaitedBody = 64u << 10;

  // Called on the waiter's thread with a connection it no longer watches:
  // kPass (serve the head) or kAnswered (send the answer and close). It
  // must not block: hand the work to a worker. `received`: the request's
  // head and body when the waiter read them from the socket (empty: the
  // head is still there, and the body, if any, after it).
  struct Received {
    std::string bytes;
    bool sent_continue = false;  // the waiter answered Expect: 100-continue
  };
  using Ready = std::function<void(int sock, GateOutcome outcome, int n_served, Received received)>;

  HeadWaiter(GateLimits limits, HeadCheck check, Ready ready);
  ~HeadWaiter();
  HeadWaiter(const HeadWaiter&) = delete;
  HeadWaiter& operator=(const HeadWaiter&) = delete;

  // Takes `sock` and waits for its next request; n_served: requests the
  // connection has carried so far (0: a new connection). After stop(), the
  // socket is closed at once.
  void add(int sock, int n_served);
  // Closes every waiting connection and joins the thread.
  void stop();

  size_t n_waiting() const { return n_waiting_; }
  // Bytes of bodies being read into memory now (within max_buffered_body_bytes).
  size_t n_buffered_body_bytes() const { return n_buffered_bytes_; }
  // New connections closed by their client before a whole head arrived.
  int64_t n_closed_before_request() const { return n_closed_before_request_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Waiting {
    int n_served = 0;
    bool started = false;  // a byte of the head has arrived
    Clock::time_point deadline;
    // A head that passed, waiting for its body to be all in the receive
    // buffer (bodies up to kMaxWaitedBody): `need` bytes in all.
    std::optional<GateOutcome> passed;
    size_t need = 0;
    // Larger bodies: read, head first, into `received` (need bytes reserved
    // of the budget), or parked until the budget has room.
    bool reading = false;
    bool parked = false;
    bool expects_continue = false;
    Received received;
  };

  void loop();
  void take_incoming();
  void judge(int sock, Waiting& w, uint32_t events);
  void wait_for_body(int sock, Waiting& w, uint32_t events);
  void read_body(int sock, Waiting& w, uint32_t events);
  bool start_reading(int sock, Waiting& w);  // false: dropped
  void unreserve(int sock, const Waiting& w);  // frees w's share of the body budget
  void admit_parked();                         // starts reading parked bodies that now fit
  int expire(Clock::time_point now);  // -> ms to the next deadline, -1: none
  void forget(int sock);              // stops watching; the socket stays open
  void drop(int sock, const Waiting& w, bool client_closed);

  const GateLimits limits_;
  const HeadCheck check_;
  const Ready ready_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::mutex mutex_;
  std::vector<std::pair<int, int>> incoming_;  // (sock, n_served), under mutex_
  bool stopped_ = false;                       // under mutex_
  std::unordered_map<int, Waiting> waiting_;   // the loop's thread only
  std::string peek_buf_;                       // the loop's thread only: [max_head_bytes + 1]
  std::vector<int> parked_;                    // the loop's thread only: in arrival order
  size_t reserved_bytes_ = 0;                  // the loop's thread only
  std::atomic<size_t> n_buffered_bytes_{0};
  std::atomic<size_t> n_waiting_{0};
  std::atomic<int64_t> n_closed_before_request_{0};
  std::thread thread_;
};

}  // namespace shardlm::server
