#include "server/head_waiter.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <string_view>

#include "core/error.h"

namespace shardlm::server {
namespace {

void set_rcvlowat(int sock, int bytes) { ::setsockopt(sock, SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes); }

void close_now(int sock) {
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

}  // namespace

HeadWaiter::HeadWaiter(GateLimits limits, HeadCheck check, Ready ready)
    : limits_(limits), check_(std::move(check)), ready_(std::move(ready)) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) fail(ErrorCode::kIo, "cannot create the HTTP connection poller (epoll/eventfd)");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { loop(); });
}

HeadWaiter::~HeadWaiter() {
  stop();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void HeadWaiter::add(int sock, int n_served) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopped_) {
      incoming_.emplace_back(sock, n_served);
      ++n_waiting_;
      const uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);
      return;
    }
  }
  close_now(sock);
}

void HeadWaiter::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
}

void HeadWaiter::take_incoming() {
  uint64_t count;
  (void)!::read(wake_fd_, &count, sizeof count);
  std::vector<std::pair<int, int>> incoming;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming.swap(incoming_);
  }
  const auto now = Clock::now();
  for (const auto& [sock, n_served] : incoming) {
    Waiting w;
    w.n_served = n_served;
    w.deadline = now + (n_served == 0 ? limits_.start_timeout : limits_.keep_alive_timeout);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = sock;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, sock, &ev) != 0) {
      --n_waiting_;
      close_now(sock);
      continue;
    }
    waiting_[sock] = w;
  }
}

void HeadWaiter::forget(int sock) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, sock, nullptr);
  set_rcvlowat(sock, 1);
  waiting_.erase(sock);
  --n_waiting_;
}

void HeadWaiter::drop(int sock, const Waiting& w, bool client_closed) {
  if (client_closed && (w.n_served == 0 || w.started)) ++n_closed_before_request_;
  unreserve(sock, w);
  forget(sock);
  close_now(sock);
}

void HeadWaiter::unreserve(int sock, const Waiting& w) {
  if (w.reading) {
    reserved_bytes_ -= w.need;
    n_buffered_bytes_ -= w.received.bytes.size();
  }
  if (w.parked) parked_.erase(std::find(parked_.begin(), parked_.end(), sock));
}

// Bytes in the receive buffer; -1 on error.
// What SO_RCVLOWAT can wait for: half the receive buffer (the kernel's cap).
// A request larger than the buffer can hold would never wake the poller:
// the client stops at a zero window first.
static uint64_t receive_buffer_half(int sock) {
  int bytes = 0;
  socklen_t len = sizeof bytes;
  return ::getsockopt(sock, SOL_SOCKET, SO_RCVBUF, &bytes, &len) == 0 && bytes > 0 ? uint64_t(bytes) / 2 : 0;
}

static int64_t buffered(int sock) {
  int n = 0;
  return ::ioctl(sock, FIONREAD, &n) == 0 ? n : -1;
}

void HeadWaiter::judge(int sock, Waiting& w, uint32_t events) {
  if (events & EPOLLERR) return drop(sock, w, true);
  if (w.parked) {
    if (events & EPOLLHUP) return drop(sock, w, true);  // gone before its turn
    if (events & EPOLLRDHUP) {
      // Half-closed, or gone: its bytes are read in its turn either way. Stop
      // watching meanwhile (the level-triggered hang-up would wake us in vain).
      epoll_event ev{};
      ev.data.fd = sock;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, sock, &ev);
    }
    return;
  }
  if (w.reading) return read_body(sock, w, events);
  if (w.passed) return wait_for_body(sock, w, events);
  const size_t cap = limits_.max_head_bytes + 1;
  peek_buf_.resize(cap);  // allocated once: every wake-up of every connection peeks into it
  ssize_t got;
  do got = ::recv(sock, peek_buf_.data(), cap, MSG_PEEK | MSG_DONTWAIT);
  while (got < 0 && errno == EINTR);
  if (got == 0) return drop(sock, w, true);  // closed with no (further) request
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    return drop(sock, w, true);
  }
  const std::string buf = peek_buf_.substr(0, static_cast<size_t>(got));
  if (!w.started) {
    w.started = true;
    w.deadline = Clock::now() + limits_.head_timeout;
  }
  std::optional<GateOutcome> verdict = judge_head(buf, limits_, check_);
  if (!verdict) {
    // Half a head and the client stopped sending: no one to answer.
    if (events & EPOLLRDHUP) return drop(sock, w, true);
    set_rcvlowat(sock, static_cast<int>(buf.size() + 1));
    return;
  }
  if (verdict->result == GateResult::kPass) {
    const uint64_t body = std::stoull(verdict->head.field("content-length").value_or("0"));  // judged valid
    const size_t need = verdict->head.n_bytes + static_cast<size_t>(body);
    // A client that sent Expect: 100-continue sends its body only after a
    // 100 Continue: the waiter sends it when it starts reading the body.
    const bool expects_continue = verdict->head.field("expect").has_value() && verdict->head.version == "HTTP/1.1";
    const bool in_kernel = body <= kMaxWaitedBody && need <= receive_buffer_half(sock) && !expects_continue;
    if (body > 0 && (in_kernel || need <= limits_.max_buffered_body_bytes)) {
      w.need = need;
      w.expects_continue = expects_continue;
      w.passed = std::move(verdict);
      w.deadline = Clock::now() + limits_.body_timeout;
      if (in_kernel) return wait_for_body(sock, w, events);
      if (reserved_bytes_ + need > limits_.max_buffered_body_bytes) {
        // No room now: leave its bytes in the socket, and stop watching for
        // them (level-triggered EPOLLIN would wake the loop in vain).
        w.parked = true;
        parked_.push_back(sock);
        epoll_event ev{};
        ev.events = EPOLLRDHUP;
        ev.data.fd = sock;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, sock, &ev);
        return;
      }
      if (start_reading(sock, w)) read_body(sock, w, events);
      return;
    }
    // A body larger than the whole budget: the worker reads it, within body_timeout.
  }
  const int n_served = w.n_served;
  forget(sock);
  ready_(sock, std::move(*verdict), n_served, {});
}

bool HeadWaiter::start_reading(int sock, Waiting& w) {
  reserved_bytes_ += w.need;
  w.reading = true;
  w.parked = false;
  w.received.bytes.reserve(w.need);  // address space only: pages are touched as bytes arrive
  set_rcvlowat(sock, 1);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = sock;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, sock, &ev);
  if (w.expects_continue) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    const ssize_t n = ::send(sock, kContinue.data(), kContinue.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != static_cast<ssize_t>(kContinue.size())) {  // 25 bytes into an idle connection's empty send buffer
      drop(sock, w, true);
      return false;
    }
    w.received.sent_continue = true;
  }
  return true;
}

void HeadWaiter::read_body(int sock, Waiting& w, uint32_t events) {
  std::string& bytes = w.received.bytes;
  char chunk[64 << 10];  // not resize(need) per wake-up: a trickle would zero megabytes per byte
  while (bytes.size() < w.need) {
    ssize_t n;
    do n = ::recv(sock, chunk, std::min(sizeof chunk, w.need - bytes.size()), MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
      bytes.append(chunk, static_cast<size_t>(n));
      n_buffered_bytes_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !(events & EPOLLRDHUP)) return;
    return drop(sock, w, true);  // closed, or failed, before the body was whole
  }
  unreserve(sock, w);
  const int n_served = w.n_served;
  GateOutcome outcome = std::move(*w.passed);
  Received received = std::move(w.received);
  forget(sock);
  ready_(sock, std::move(outcome), n_served, std::move(received));
}

void HeadWaiter::admit_parked() {
  while (!parked_.empty()) {
    const int sock = parked_.front();
    Waiting& w = waiting_.at(sock);
    if (reserved_bytes_ + w.need > limits_.max_buffered_body_bytes) return;
    parked_.erase(parked_.begin());
    start_reading(sock, w);  // its bytes wake the loop on the next wait
  }
}

void HeadWaiter::wait_for_body(int sock, Waiting& w, uint32_t events) {
  const int64_t have = buffered(sock);
  if (have < 0) return drop(sock, w, true);
  if (static_cast<size_t>(have) < w.need) {
    if (events & EPOLLRDHUP) return drop(sock, w, true);  // the body will never be whole
    set_rcvlowat(sock, static_cast<int>(w.need));
    return;
  }
  const int n_served = w.n_served;
  GateOutcome outcome = std::move(*w.passed);
  forget(sock);
  ready_(sock, std::move(outcome), n_served, {});
}

int HeadWaiter::expire(Clock::time_point now) {
  std::vector<int> late;
  Clock::time_point next = Clock::time_point::max();
  for (const auto& [sock, w] : waiting_) {
    if (w.deadline <= now) late.push_back(sock);
    else next = std::min(next, w.deadline);
  }
  for (int sock : late) {
    const Waiting w = waiting_[sock];
    if (!w.started && w.n_served > 0) {  // an idle kept-alive connection
      drop(sock, w, false);
      continue;
    }
    GateOutcome outcome;
    outcome.result = GateResult::kAnswered;
    outcome.answer =
        w.passed ? gate_error(408,
                              "the request body did not arrive within " +
                                  std::to_string(limits_.body_timeout.count()) + " ms of its headers",
                              "request_timeout")
        : w.started ? gate_error(408,
                               "the request headers did not arrive within " +
                                   std::to_string(limits_.head_timeout.count()) + " ms",
                               "request_timeout")
                  : gate_error(408,
                               "no request arrived within " + std::to_string(limits_.start_timeout.count()) +
                                   " ms of connecting; send the request line and headers promptly",
                               "request_timeout");
    unreserve(sock, w);
    forget(sock);
    ready_(sock, std::move(outcome), w.n_served, {});
  }
  if (next == Clock::time_point::max()) return -1;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

void HeadWaiter::loop() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  int timeout_ms = -1;
  for (;;) {
    const int n = ::epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        take_incoming();
        continue;
      }
      auto it = waiting_.find(fd);
      if (it != waiting_.end()) judge(fd, it->second, events[i].events);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) break;
    }
    timeout_ms = expire(Clock::now());
    admit_parked();  // after what this round freed
  }
  // Stopped: no one will serve what waits (its requests were not started).
  take_incoming();
  for (const auto& [sock, w] : waiting_) {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, sock, nullptr);
    close_now(sock);
  }
  waiting_.clear();
  parked_.clear();
  reserved_bytes_ = 0;
  n_buffered_bytes_ = 0;
  n_waiting_ = 0;
}

}  // namespace shardlm::server
