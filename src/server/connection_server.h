// An httplib::Server whose connections are ours between requests: every
// request's head is checked before httplib reads a byte of it
// (server/request_gate.h), connections wait for their next request on one
// epoll thread instead of a worker (server/head_waiter.h), and a handler can
// tell which connection it serves.
//
// cpp-httplib (0.11, Debian 12) serves one connection on one worker thread
// from accept to close, and its keep-alive loop reads each next request
// itself: unbounded, and through a socket stream that reads ahead, so a
// pipelined request could be lost. This subclass takes the connection over
// in process_and_close_socket: the gate waits for and judges each head, and
// one request at a time is handed to httplib's request processing over our
// own stream (ConnectionStream, in the .cpp) that never reads past the
// request it serves. Connections are kept alive (up to
// max_requests_per_connection requests), and pipelined requests are
// answered in order.
//
// A handler polls its own connection for a hang-up (current_client_gone):
// a client that shut only its sending side (a half-close) still waits for
// its answer, which a write tells apart from one that left (its reset
// comes back). The probe is a 100 Continue before the response starts, and
// an SSE comment between the events of a started event stream (after a
// chunk that ended an event: a relay's chunks may split one).
//
// A request reaches a worker with its body whole (the head waiter waits for
// it, in the kernel's buffer or in memory), so a client that trickles its
// body holds no thread; only a body larger than max_buffered_body_bytes is
// read by the worker.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "engine/arrivals.h"
#include "server/head_waiter.h"
#include "server/request_gate.h"

namespace shardlm::server {

class WorkerPool;

class ConnectionServer : public httplib::Server {
 public:
  // max_threads: requests served at once (workers start on demand); more
  // wait for a worker. Connections between requests hold none.
  explicit ConnectionServer(size_t max_threads);
  ~ConnectionServer() override;

  // The socket of the connection the calling thread serves; -1 outside a
  // handler (or on a thread that serves no connection).
  static int current_socket();
  // True once the client of the calling thread's connection left: it
  // closed (a half-close is probed, see above) or the socket failed. False
  // when there is no current socket.
  static bool current_client_gone();
  // The head of the request the calling thread serves, as the client sent
  // it; nullptr outside a handler.
  static const RequestHead* current_head();

  // The request the calling thread serves has gone to the engine (or never
  // will): its announcement (set_arrivals) is withdrawn. A no-op when there
  // is none; the end of the request withdraws it anyway.
  static void release_current_arrival();

  // Call before listening.
  void set_gate_limits(const GateLimits& limits);
  // Each POST is announced to `arrivals` when its head and body are in,
  // before a worker parses it (engine/arrivals.h: burst admission).
  void set_arrivals(std::shared_ptr<Arrivals> arrivals) { arrivals_ = std::move(arrivals); }
  void set_head_check(HeadCheck check) { check_ = std::move(check); }

  // Requests refused from their head alone (any status), and connections
  // closed by their client before a whole head arrived.
  int64_t n_refused_at_gate() const { return n_refused_; }
  int64_t n_closed_before_request() const;
  // Connections waiting for a request (new or kept alive), or for its body.
  size_t n_waiting_connections() const;
  // Bytes of request bodies the head waiter holds now (GateLimits::max_buffered_body_bytes).
  size_t n_buffered_body_bytes() const;
  // Requests served on a connection after its first.
  int64_t n_reused() const { return n_reused_; }

 private:
  bool process_and_close_socket(socket_t sock) override;
  void dispatch(int sock, GateOutcome outcome, int n_served, HeadWaiter::Received received);
  void serve(int sock, const RequestHead& head, int n_served, HeadWaiter::Received received,
             Arrivals::Ticket& arrival);

  const size_t max_threads_;
  GateLimits limits_;
  HeadCheck check_;
  std::shared_ptr<Arrivals> arrivals_;
  std::unique_ptr<WorkerPool> pool_;  // serves requests; made when listening starts
  std::unique_ptr<HeadWaiter> waiter_;  // made when listening starts (serve listens once)
  std::atomic<HeadWaiter*> waiter_view_{nullptr};  // waiter_, for the counters read from other threads
  std::atomic<int64_t> n_refused_{0};
  std::atomic<int64_t> n_reused_{0};
};

}  // namespace shardlm::server
