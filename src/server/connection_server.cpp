#include "server/connection_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

thread_local int t_socket = -1;
thread_local const shardlm::server::RequestHead* t_head = nullptr;

}  // namespace

// httplib::Server::process_and_close_socket is a private virtual: a subclass
// may override it but not name the base version. The library exports it
// (libcpp-httplib.so, Itanium C++ ABI: `this` is the first argument), so the
// base implementation is reached through its symbol. Linking fails loudly
// should a different httplib stop exporting it.
extern bool httplib_server_process_and_close_socket(httplib::Server* self, socket_t sock) __asm__(
    "_ZN7httplib6Server24process_and_close_socketEi");

namespace shardlm::server {

ConnectionServer::ConnectionServer() { set_keep_alive_max_count(1); }

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  GateOutcome gate = read_request_head(sock, limits_, check_);
  switch (gate.result) {
    case GateResult::kPass:
      break;
    case GateResult::kClientGone:
      ++n_closed_before_request_;
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      return false;
    case GateResult::kAnswered:
      ++n_refused_;
      send_answer_and_close(sock, gate.answer);
      return false;
  }
  struct Scope {
    Scope(int s, const RequestHead* h) {
      t_socket = s;
      t_head = h;
    }
    ~Scope() {
      t_socket = -1;
      t_head = nullptr;
    }
  } scope(sock, &gate.head);
  return httplib_server_process_and_close_socket(this, sock);
}

int ConnectionServer::current_socket() { return t_socket; }

const RequestHead* ConnectionServer::current_head() { return t_head; }

bool ConnectionServer::current_client_gone() {
  if (t_socket < 0) return false;
  pollfd p{t_socket, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace shardlm::server
