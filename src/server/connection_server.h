// An httplib::Server that tells a handler which connection it serves, and
// that never closes a connection silently while its first request is late.
//
// cpp-httplib (0.11, Debian 12) serves one connection on one worker thread
// from accept to close, inside Server::process_and_close_socket(sock), and
// runs every handler and content provider of that connection on that
// thread, but hands handlers no socket. This subclass records the socket in
// a thread-local while the connection is served, so a handler can poll its
// own connection for a hang-up (POLLRDHUP): a real per-connection signal,
// in place of scanning /proc/self/fd for a socket whose peer matches.
//
// httplib waits for a connection's first byte with its keep-alive timeout
// (5 s), polling every millisecond, and closes the connection without a
// word when nothing came: a client that was slow to write (a starved
// process, a busy host) got a bare close after its request was accepted,
// and every idle connection cost a thousand wake-ups a second. Here the
// first byte is awaited in poll(2), for request_start_timeout; a client
// that sends nothing in that time gets 408 with an OpenAI-shaped body.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace shardlm::server {

class ConnectionServer : public httplib::Server {
 public:
  // The socket of the connection the calling thread serves; -1 outside a
  // handler (or on a thread that serves no connection).
  static int current_socket();
  // True once the client of the calling thread's connection closed it or
  // the socket failed. False when there is no current socket.
  static bool current_client_gone();

  // How long a new connection may stay silent before its first request
  // starts; then it gets 408. Call before listening.
  void set_request_start_timeout(std::chrono::milliseconds t) { request_start_timeout_ = t; }

  // Connections that got 408 because no request started in time, and
  // connections closed by their client before sending anything.
  int64_t n_request_start_timeouts() const { return n_start_timeouts_; }
  int64_t n_closed_before_request() const { return n_closed_before_request_; }

 private:
  bool process_and_close_socket(socket_t sock) override;

  std::chrono::milliseconds request_start_timeout_{std::chrono::seconds(60)};
  std::atomic<int64_t> n_start_timeouts_{0};
  std::atomic<int64_t> n_closed_before_request_{0};
};

}  // namespace shardlm::server
