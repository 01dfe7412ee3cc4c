#include "bench/sse_load_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace shardlm::bench {

namespace {

using Clock = std::chrono::steady_clock;

struct Client {
  int fd = -1;
  Clock::time_point t0;
  std::string request;
  size_t sent = 0;
  std::string in;
  size_t scanned = 0;      // `in` before this offset was searched already
  size_t counted_end = 0;  // end of the last text needle counted
  bool status_checked = false;
  bool open = true;
};

constexpr const char* kText = "\"text\":\"";  // one per text chunk of a completion
constexpr size_t kTextLen = 8;
constexpr const char* kDone = "data: [DONE]";
constexpr size_t kDoneLen = 12;

}  // namespace

std::vector<StreamResult> run_sse_clients(int port, int n_connections, int64_t max_tokens,
                                          std::chrono::milliseconds timeout) {
  std::vector<StreamResult> results(static_cast<size_t>(n_connections));
  std::vector<Client> clients(static_cast<size_t>(n_connections));
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int n_open = 0;
  for (int i = 0; i < n_connections; ++i) {
    Client& c = clients[static_cast<size_t>(i)];
    const std::string body = "{\"model\":\"m\",\"prompt\":[" + std::to_string(3 + i % 200) +
                             ",17,41,230,9,77,5,12],\"max_tokens\":" + std::to_string(max_tokens) +
                             ",\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";
    c.request = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    c.t0 = Clock::now();
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      results[static_cast<size_t>(i)].error = std::string("socket: ") + std::strerror(errno);
      c.open = false;
      continue;
    }
    int yes = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 && errno != EINPROGRESS) {
      results[static_cast<size_t>(i)].error = std::string("connect: ") + std::strerror(errno);
      close(c.fd);
      c.open = false;
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = static_cast<uint64_t>(i);
    epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
    ++n_open;
  }

  auto finish = [&](size_t i, const std::string& error) {
    Client& c = clients[i];
    if (!c.open) return;
    StreamResult& r = results[i];
    if (!error.empty() && r.error.empty()) r.error = error;
    if (r.error.empty() && !r.ok) r.error = "connection closed before [DONE]";
    close(c.fd);
    c.open = false;
    --n_open;
  };

  const auto deadline = Clock::now() + timeout;
  std::vector<epoll_event> events(512);
  char buf[65536];
  while (n_open > 0 && Clock::now() < deadline) {
    const int wait_ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    const int n = epoll_wait(ep, events.data(), static_cast<int>(events.size()), std::max(1, wait_ms));
    for (int k = 0; k < n; ++k) {
      const size_t i = events[k].data.u64;
      Client& c = clients[i];
      StreamResult& r = results[i];
      if (!c.open) continue;
      if ((events[k].events & EPOLLOUT) && c.sent < c.request.size()) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          finish(i, std::string("connect: ") + std::strerror(err));
          continue;
        }
        ssize_t put = send(c.fd, c.request.data() + c.sent, c.request.size() - c.sent, MSG_NOSIGNAL);
        if (put > 0) c.sent += static_cast<size_t>(put);
        if (c.sent == c.request.size()) {
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.u64 = i;
          epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &ev);
        }
      }
      if (!(events[k].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) continue;
      bool closed = false;
      for (;;) {
        ssize_t got = read(c.fd, buf, sizeof buf);
        if (got > 0) {
          c.in.append(buf, static_cast<size_t>(got));
          continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EINTR)) closed = true;
        if (got < 0 && errno == EINTR) continue;
        break;
      }
      if (!c.status_checked && c.in.find("\r\n\r\n") != std::string::npos) {
        c.status_checked = true;
        r.headers_s = std::chrono::duration<double>(Clock::now() - c.t0).count();
        if (c.in.rfind("HTTP/1.1 200 ", 0) != 0) {
          finish(i, "status: " + c.in.substr(0, std::min<size_t>(c.in.size(), 300)));
          continue;
        }
      }
      // New text chunks since the last read (a needle may straddle two
      // reads: search again from just before the previous end).
      const size_t from = std::max(c.counted_end, c.scanned >= kTextLen ? c.scanned - kTextLen + 1 : 0);
      for (size_t at = c.in.find(kText, from); at != std::string::npos; at = c.in.find(kText, at + kTextLen)) {
        ++r.n_text_chunks;
        c.counted_end = at + kTextLen;
      }
      if (r.ttft_s < 0 && r.n_text_chunks > 0) r.ttft_s = std::chrono::duration<double>(Clock::now() - c.t0).count();
      const size_t done_from = c.scanned >= kDoneLen ? c.scanned - kDoneLen + 1 : 0;
      c.scanned = c.in.size();
      if (c.in.find(kDone, done_from) != std::string::npos) {
        r.ok = r.n_text_chunks == max_tokens;
        if (!r.ok) r.error = "got " + std::to_string(r.n_text_chunks) + " text chunks, expected " + std::to_string(max_tokens);
        finish(i, "");
        continue;
      }
      if (closed) finish(i, "");
    }
  }
  for (size_t i = 0; i < clients.size(); ++i) finish(i, "timeout");
  close(ep);
  return results;
}

}  // namespace shardlm::bench
