#include "server/connection_server.h"

#include <poll.h>

namespace {

thread_local int t_socket = -1;

}  // namespace

// httplib::Server::process_and_close_socket is a private virtual: a subclass
// may override it but not name the base version. The library exports it
// (libcpp-httplib.so, Itanium C++ ABI: `this` is the first argument), so the
// base implementation is reached through its symbol. Linking fails loudly
// should a different httplib stop exporting it.
extern bool httplib_server_process_and_close_socket(httplib::Server* self, socket_t sock) __asm__(
    "_ZN7httplib6Server24process_and_close_socketEi");

namespace shardlm::server {

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  struct Scope {
    explicit Scope(int s) { t_socket = s; }
    ~Scope() { t_socket = -1; }
  } scope(sock);
  return httplib_server_process_and_close_socket(this, sock);
}

int ConnectionServer::current_socket() { return t_socket; }

bool ConnectionServer::current_client_gone() {
  if (t_socket < 0) return false;
  pollfd p{t_socket, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace shardlm::server
