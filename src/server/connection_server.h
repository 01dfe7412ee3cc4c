// An httplib::Server that checks each request's head before httplib reads
// it (server/request_gate.h), and tells a handler which connection it
// serves.
//
// cpp-httplib (0.11, Debian 12) serves one connection on one worker thread
// from accept to close, inside Server::process_and_close_socket(sock), and
// runs every handler and content provider of that connection on that
// thread, but hands handlers no socket. This subclass records the socket and
// the request's raw head in thread-locals while the connection is served, so
// a handler can poll its own connection for a hang-up (POLLRDHUP) and read
// header values exactly as sent (httplib URL-decodes them).
//
// httplib waited for a connection's first byte with its keep-alive timeout
// (5 s), polling every millisecond, and closed the connection without a word
// when nothing came: a client slow to write (a starved process, a busy host)
// got a bare close after its request was accepted, and every idle connection
// cost a thousand wake-ups a second. The gate waits in poll(2) instead and
// answers 408. Each connection carries one request (Connection: close), so
// that every request passes the gate: httplib's keep-alive loop would read
// the next request itself, unbounded, and dropped pipelined requests.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>

#include "server/request_gate.h"

namespace shardlm::server {

class ConnectionServer : public httplib::Server {
 public:
  ConnectionServer();

  // The socket of the connection the calling thread serves; -1 outside a
  // handler (or on a thread that serves no connection).
  static int current_socket();
  // True once the client of the calling thread's connection closed it or
  // the socket failed. False when there is no current socket.
  static bool current_client_gone();
  // The head of the request the calling thread serves, as the client sent
  // it; nullptr outside a handler.
  static const RequestHead* current_head();

  // Call before listening.
  void set_gate_limits(const GateLimits& limits) { limits_ = limits; }
  void set_head_check(HeadCheck check) { check_ = std::move(check); }

  // Requests refused from their head alone (any status), and connections
  // closed by their client before a whole head arrived.
  int64_t n_refused_at_gate() const { return n_refused_; }
  int64_t n_closed_before_request() const { return n_closed_before_request_; }

 private:
  bool process_and_close_socket(socket_t sock) override;

  GateLimits limits_;
  HeadCheck check_;
  std::atomic<int64_t> n_refused_{0};
  std::atomic<int64_t> n_closed_before_request_{0};
};

}  // namespace shardlm::server
