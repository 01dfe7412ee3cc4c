#include "server/connection_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>

#include "server/head_waiter.h"
#include "server/worker_pool.h"

namespace shardlm::server {
namespace {

using Clock = std::chrono::steady_clock;

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

bool wait_for(int sock, short what, int timeout_ms) {
  pollfd p{sock, what, 0};
  int n;
  do n = ::poll(&p, 1, timeout_ms);
  while (n < 0 && errno == EINTR);
  return n > 0 && (p.revents & what) != 0;
}

void address_of(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = peer ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len)
                      : ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char host[NI_MAXHOST], service[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, service, sizeof service,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return;
  ip = host;
  port = std::atoi(service);
}

// One request's view of its connection, for httplib's request processing.
// The head (already judged by the gate) is read from the socket at once;
// after it, reads never go past the request's Content-Length, so the next
// pipelined request stays in the socket for the gate. Every read and write
// is bounded by io_timeout, and the body as a whole by body_timeout.
class ConnectionStream final : public httplib::Stream {
 public:
  // `head`: the bytes already taken from the socket (the head, and the body
  // too when the head waiter read it); body_bytes: what is left to read.
  // sent_continue: the head waiter answered Expect: 100-continue already.
  ConnectionStream(int sock, std::string head, uint64_t body_bytes, const GateLimits& limits, bool http11,
                   bool sent_continue)
      : sock_(sock), head_(std::move(head)), body_left_(body_bytes), io_ms_(int(limits.io_timeout.count())),
        body_deadline_(Clock::now() + limits.body_timeout), http11_(http11), sent_continue_(sent_continue) {}

  bool is_readable() const override {
    return off_ < head_.size() || wait_for(sock_, POLLIN, std::min(io_ms_, ms_until(body_deadline_)));
  }
  bool is_writable() const override { return !failed_ && wait_for(sock_, POLLOUT, io_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (off_ < head_.size()) {
      const size_t n = std::min(size, head_.size() - off_);
      std::memcpy(ptr, head_.data() + off_, n);
      off_ += n;
      return static_cast<ssize_t>(n);
    }
    size = static_cast<size_t>(std::min<uint64_t>(size, body_left_));
    if (size == 0) return 0;
    if (!wait_for(sock_, POLLIN, std::min(io_ms_, ms_until(body_deadline_)))) return fail();
    ssize_t n;
    do n = ::recv(sock_, ptr, size, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return fail();
    body_left_ -= static_cast<uint64_t>(n);
    return n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    // httplib's own 100 Continue for a body that has already arrived.
    if (!started_ && sent_continue_ && std::string_view(ptr, size).starts_with("HTTP/1.1 100 ")) return ssize_t(size);
    if (!started_) {
      // httplib writes the status line and headers in one piece.
      started_ = true;
      const std::string_view head(ptr, size);
      sse_ = head.find("Content-Type: text/event-stream") != std::string_view::npos &&
             head.find("Transfer-Encoding: chunked") != std::string_view::npos;
      at_event_end_ = true;  // no event started yet
    } else {
      // A chunk whose payload ends with a blank line ends an SSE event: only
      // there may a probe go in. Our own streams write whole events per
      // chunk; a relay (the router) ends its chunks where the upstream's did.
      at_event_end_ = std::string_view(ptr, size).ends_with("\n\n\r\n");
    }
    return write_all(ptr, size) ? static_cast<ssize_t>(size) : -1;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(sock_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(sock_, false, ip, port); }
  socket_t socket() const override { return sock_; }

  // After the response: reads and drops what the handler left unread of the
  // body (an early error skips it); false when it failed to arrive.
  bool discard_body() {
    char scratch[16384];
    while (body_left_ > 0 && !failed_)
      if (read(scratch, sizeof scratch) <= 0) return false;
    return !failed_;
  }
  bool usable() const { return !failed_; }

  // The client shut its sending side. True while it may still be waiting
  // for the answer: a probe went out (at most one a second) and no reset
  // has come back yet (that shows as POLLHUP/POLLERR). False when no probe
  // fits what was written so far, or the probe failed.
  bool probe_half_closed_peer() {
    const auto now = Clock::now();
    if (probed_ && now - last_probe_ < std::chrono::seconds(1)) return true;
    std::string_view probe;
    if (!started_ && http11_) probe = "HTTP/1.1 100 Continue\r\n\r\n";  // any number of 1xx may precede the answer
    else if (started_ && sse_ && at_event_end_) probe = "8\r\n: ping\n\n\r\n";  // an SSE comment, as one chunk
    else return false;
    probed_ = true;
    last_probe_ = now;
    return write_all(probe.data(), probe.size());
  }

 private:
  ssize_t fail() {
    failed_ = true;
    return -1;
  }
  bool write_all(const char* ptr, size_t size) {
    size_t off = 0;
    while (off < size && !failed_) {
      ssize_t n = ::send(sock_, ptr + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait_for(sock_, POLLOUT, io_ms_)) fail();
        continue;
      }
      if (n <= 0) return fail(), false;
      off += static_cast<size_t>(n);
    }
    return !failed_;
  }

  const int sock_;
  const std::string head_;
  size_t off_ = 0;
  uint64_t body_left_;
  const int io_ms_;
  const Clock::time_point body_deadline_;
  const bool http11_;
  const bool sent_continue_;
  bool started_ = false;  // a byte of the response was written
  bool sse_ = false;      // the response is a chunked event stream
  bool at_event_end_ = false;  // what was written last ends an SSE event
  bool failed_ = false;
  bool probed_ = false;
  Clock::time_point last_probe_;
};

thread_local int t_socket = -1;
thread_local const RequestHead* t_head = nullptr;
thread_local ConnectionStream* t_stream = nullptr;
thread_local Arrivals::Ticket* t_arrival = nullptr;

// httplib's accept loop hands each accepted socket to its task queue. Ours
// runs the hand-off on the accept thread: it only gives the socket to the
// head waiter. Its shutdown (the listen loop's end) stops the waiter and
// then lets the requests being served finish.
class HandOffQueue final : public httplib::TaskQueue {
 public:
  explicit HandOffQueue(std::function<void()> on_shutdown) : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

}  // namespace

// httplib::Server::process_request is private; the library exports it
// (libcpp-httplib.so, Itanium C++ ABI: `this` is the first argument), so it
// is reached through its symbol. Linking fails loudly should a different
// httplib stop exporting it.
extern bool httplib_server_process_request(httplib::Server* self, httplib::Stream& strm, bool close_connection,
                                           bool& connection_closed,
                                           const std::function<void(httplib::Request&)>& setup_request) __asm__(
    "_ZN7httplib6Server15process_requestERNS_6StreamEbRbRKSt8functionIFvRNS_7RequestEEE");

ConnectionServer::ConnectionServer(size_t max_threads) : max_threads_(std::max<size_t>(1, max_threads)) {
  set_gate_limits(limits_);
  new_task_queue = [this] {
    pool_ = std::make_unique<WorkerPool>(max_threads_);
    waiter_ = std::make_unique<HeadWaiter>(
        limits_, check_, [this](int sock, GateOutcome outcome, int n_served, HeadWaiter::Received received) {
          dispatch(sock, std::move(outcome), n_served, std::move(received));
        });
    waiter_view_ = waiter_.get();
    return new HandOffQueue([this] {
      waiter_->stop();
      pool_->shutdown();
    });
  };
}

ConnectionServer::~ConnectionServer() {
  if (waiter_) waiter_->stop();
  if (pool_) pool_->shutdown();
}

void ConnectionServer::set_gate_limits(const GateLimits& limits) {
  limits_ = limits;
  // What the Keep-Alive header of each response announces.
  set_keep_alive_timeout(std::max<time_t>(1, std::chrono::duration_cast<std::chrono::seconds>(limits.keep_alive_timeout).count()));
  set_keep_alive_max_count(std::max<size_t>(1, limits.max_requests_per_connection));
}

bool ConnectionServer::process_and_close_socket(socket_t sock) {
  waiter_->add(sock, 0);
  return true;
}

void ConnectionServer::dispatch(int sock, GateOutcome outcome, int n_served, HeadWaiter::Received received) {
  if (outcome.result == GateResult::kAnswered) {
    ++n_refused_;
    pool_->enqueue([sock, answer = std::move(outcome.answer)] { send_answer_and_close(sock, answer); });
    return;
  }
  // GETs never reach the engine: only a POST may be part of a burst.
  Arrivals::Ticket arrival;
  if (arrivals_ && outcome.head.method == "POST") arrival = arrivals_->announce();
  pool_->enqueue([this, sock, head = std::move(outcome.head), n_served, received = std::move(received),
                  arrival = std::make_shared<Arrivals::Ticket>(std::move(arrival))]() mutable {
    serve(sock, head, n_served, std::move(received), *arrival);
    arrival->release();
  });
}

void ConnectionServer::serve(int sock, const RequestHead& head, int n_served, HeadWaiter::Received received,
                             Arrivals::Ticket& arrival) {
  if (n_served > 0) ++n_reused_;
  uint64_t body_bytes = std::stoull(head.field("content-length").value_or("0"));  // the gate checked it
  std::string head_bytes = std::move(received.bytes);
  if (!head_bytes.empty()) {
    body_bytes = 0;  // the head waiter read head and body
  } else {
    // The head is in the receive buffer (the gate peeked at it): take it.
    head_bytes.assign(head.n_bytes, '\0');
    size_t got = 0;
    while (got < head_bytes.size()) {
      const ssize_t n = ::recv(sock, head_bytes.data() + got, head_bytes.size() - got, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return close_connection(sock);
      got += static_cast<size_t>(n);
    }
  }
  ConnectionStream strm(sock, std::move(head_bytes), body_bytes, limits_, head.version == "HTTP/1.1",
                        received.sent_continue);
  struct Scope {
    Scope(int s, const RequestHead* h, ConnectionStream* st, Arrivals::Ticket* a) {
      t_socket = s;
      t_head = h;
      t_stream = st;
      t_arrival = a;
    }
    ~Scope() {
      if (t_arrival) t_arrival->release();
      t_socket = -1;
      t_head = nullptr;
      t_stream = nullptr;
      t_arrival = nullptr;
    }
  } scope(sock, &head, &strm, &arrival);
  const bool last = size_t(n_served) + 1 >= limits_.max_requests_per_connection || !is_running();
  bool closed_by_request = false;
  const bool ok = httplib_server_process_request(this, strm, last, closed_by_request, {});
  if (ok && !last && !closed_by_request && strm.usable() && strm.discard_body()) return waiter_->add(sock, n_served + 1);
  close_connection(sock);
}

int ConnectionServer::current_socket() { return t_socket; }

void ConnectionServer::release_current_arrival() {
  if (t_arrival) t_arrival->release();
}

const RequestHead* ConnectionServer::current_head() { return t_head; }

bool ConnectionServer::current_client_gone() {
  if (t_socket < 0) return false;
  pollfd p{t_socket, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (!(p.revents & POLLRDHUP)) return false;
  return !(t_stream && t_stream->probe_half_closed_peer());
}

int64_t ConnectionServer::n_closed_before_request() const {
  const HeadWaiter* w = waiter_view_;
  return w ? w->n_closed_before_request() : 0;
}

size_t ConnectionServer::n_waiting_connections() const {
  const HeadWaiter* w = waiter_view_;
  return w ? w->n_waiting() : 0;
}

size_t ConnectionServer::n_buffered_body_bytes() const {
  const HeadWaiter* w = waiter_view_;
  return w ? w->n_buffered_body_bytes() : 0;
}

}  // namespace shardlm::server
