// An httplib::Server that tells a handler which connection it serves.
// cpp-httplib (0.11, Debian 12) serves one connection on one worker thread
// from accept to close, inside Server::process_and_close_socket(sock), and
// runs every handler and content provider of that connection on that
// thread, but hands handlers no socket. This subclass records the socket in
// a thread-local while the connection is served, so a handler can poll its
// own connection for a hang-up (POLLRDHUP): a real per-connection signal,
// in place of scanning /proc/self/fd for a socket whose peer matches.
#pragma once

#include <httplib.h>

namespace shardlm::server {

class ConnectionServer : public httplib::Server {
 public:
  // The socket of the connection the calling thread serves; -1 outside a
  // handler (or on a thread that serves no connection).
  static int current_socket();
  // True once the client of the calling thread's connection closed it or
  // the socket failed. False when there is no current socket.
  static bool current_client_gone();

 private:
  bool process_and_close_socket(socket_t sock) override;
};

}  // namespace shardlm::server
