#include "server/connection_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace {

thread_local int t_socket = -1;

enum class FirstBytes { kArrived, kClosed, kTimedOut };

// Waits in poll(2) (no wake-ups while idle) until the client sends its first
// byte, hangs up with nothing sent, or the timeout passes.
FirstBytes wait_for_first_bytes(int sock, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return FirstBytes::kTimedOut;
    pollfd p{sock, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FirstBytes::kClosed;
    if (n == 0) continue;  // the deadline check above decides
    if (p.revents & (POLLERR | POLLNVAL)) return FirstBytes::kClosed;
    char c;
    const ssize_t got = ::recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got > 0) return FirstBytes::kArrived;
    if (got == 0) return FirstBytes::kClosed;  // orderly close with nothing sent: no one to answer
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return FirstBytes::kClosed;
  }
}

void send_all(int sock, const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(sock, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

std::string request_timeout_response(std::chrono::milliseconds timeout) {
  const std::string body = "{\"error\": {\"message\": \"no request arrived within " +
                           std::to_string(timeout.count()) +
                           " ms of connecting; send the request line and headers promptly\", "
                           "\"type\": \"invalid_request_error\", \"param\": null, \"code\": \"request_timeout\"}}";
  return "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

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
  switch (wait_for_first_bytes(sock, request_start_timeout_)) {
    case FirstBytes::kArrived:
      break;
    case FirstBytes::kClosed:
      ++n_closed_before_request_;
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      return false;
    case FirstBytes::kTimedOut:
      ++n_start_timeouts_;
      send_all(sock, request_timeout_response(request_start_timeout_));
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      return false;
  }
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
