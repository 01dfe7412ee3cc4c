#include "bench/epoll_sse_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace shardlm::bench {

namespace {

constexpr uint64_t kListenKey = 0;
constexpr uint64_t kWakeKey = ~uint64_t{0};
constexpr size_t kMaxRequestBytes = 1 << 20;

std::string chunk(const std::string& payload) {
  char head[32];
  std::snprintf(head, sizeof head, "%zx\r\n", payload.size());
  return head + payload + "\r\n";
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

struct EpollSseServer::Conn {
  int fd = -1;
  uint64_t id = 0;
  std::string in;
  std::string out;
  size_t out_pos = 0;
  uint64_t stream = 0;     // engine stream id, 0 before the request is complete
  bool finished = false;   // everything is queued in `out`; close once flushed
  bool want_out = false;   // EPOLLOUT registered
  std::string response_id;
  int64_t created = 0;
};

EpollSseServer::EpollSseServer(CadenceEngine& engine) : engine_(engine) {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) throw std::runtime_error(std::string("epoll/eventfd: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  engine_.set_after_step([this] {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  });
}

EpollSseServer::~EpollSseServer() {
  engine_.set_after_step(nullptr);
  for (auto& [id, c] : conns_) close(c->fd);
  if (listen_fd_ >= 0) close(listen_fd_);
  close(wake_fd_);
  close(epoll_fd_);
}

void EpollSseServer::bind(int port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int yes = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 1024) != 0)
    throw std::runtime_error("epoll server: cannot listen on 127.0.0.1:" + std::to_string(port) + ": " +
                             std::strerror(errno));
  socklen_t len = sizeof addr;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
}

void EpollSseServer::run() {
  std::vector<epoll_event> events(256);
  for (;;) {
    int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("epoll_wait: ") + std::strerror(errno));
    }
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == kListenKey) {
        accept_all();
        continue;
      }
      if (key == kWakeKey) {
        uint64_t count = 0;
        (void)!read(wake_fd_, &count, sizeof count);
        deliver_tokens();
        continue;
      }
      auto it = conns_.find(key);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      if (events[i].events & (EPOLLERR | EPOLLHUP)) {
        close_conn(key);
        continue;
      }
      if (events[i].events & EPOLLIN) {
        on_readable(c);
        if (!conns_.count(key)) continue;
      }
      if (events[i].events & EPOLLOUT) flush(c);
    }
  }
}

void EpollSseServer::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN: all taken (or EMFILE: the rest wait in the backlog)
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    c->id = next_conn_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    conns_[c->id] = std::move(c);
  }
}

void EpollSseServer::on_readable(Conn& c) {
  char buf[16384];
  for (;;) {
    ssize_t got = read(c.fd, buf, sizeof buf);
    if (got > 0) {
      if (c.stream == 0) c.in.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got == 0 || (errno != EAGAIN && errno != EINTR)) {  // the client left
      if (c.stream != 0 && !c.finished) engine_.cancel(c.stream);
      close_conn(c.id);
      return;
    }
    if (errno == EAGAIN) break;
  }
  if (c.stream != 0 || c.finished) return;
  const size_t head_end = c.in.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    if (c.in.size() > kMaxRequestBytes) reply_error(c, 413, "request head too large");
    return;
  }
  const std::string head = c.in.substr(0, head_end);
  if (head.rfind("POST /v1/completions ", 0) != 0) return reply_error(c, 404, "only POST /v1/completions is served");
  size_t length = 0;
  const std::string lhead = lower(head);
  if (size_t at = lhead.find("\r\ncontent-length:"); at != std::string::npos)
    length = std::strtoull(head.c_str() + at + 17, nullptr, 10);
  if (length > kMaxRequestBytes) return reply_error(c, 413, "body too large");
  if (c.in.size() < head_end + 4 + length) return;  // the body is still coming
  const std::string body = c.in.substr(head_end + 4, length);
  c.in.clear();
  start_stream(c, body);  // may close c
}

void EpollSseServer::start_stream(Conn& c, const std::string& body) {
  nlohmann::json req = nlohmann::json::parse(body, nullptr, false);
  if (!req.is_object()) return reply_error(c, 400, "the request body is not a JSON object");
  const auto max_tokens = req.value("max_tokens", int64_t{16});
  if (max_tokens < 1) return reply_error(c, 400, "max_tokens must be >= 1");
  if (!req.value("stream", false)) return reply_error(c, 400, "only stream: true is served");
  c.response_id = "cmpl-" + std::to_string(c.id);
  c.created = static_cast<int64_t>(std::time(nullptr));
  c.out += "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
           "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
  const uint64_t conn = c.id;
  c.stream = engine_.submit(max_tokens, [this, conn](int64_t token, bool last) {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    outbox_.push_back({conn, token, last});
  });
  flush(c);  // may close c (and cancel its stream)
}

void EpollSseServer::reply_error(Conn& c, int status, const std::string& message) {
  const std::string body = nlohmann::json{{"error", {{"message", message}, {"type", "invalid_request_error"}}}}.dump();
  c.out += "HTTP/1.1 " + std::to_string(status) + " Error\r\nContent-Type: application/json\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  c.finished = true;
  flush(c);
}

void EpollSseServer::deliver_tokens() {
  std::vector<Token> tokens;
  {
    std::lock_guard<std::mutex> lock(outbox_mutex_);
    tokens.swap(outbox_);
  }
  std::vector<uint64_t> touched;
  for (const Token& t : tokens) {
    auto it = conns_.find(t.conn);
    if (it == conns_.end()) continue;  // the client left
    Conn& c = *it->second;
    const char text[2] = {static_cast<char>('a' + t.token % 26), 0};
    nlohmann::ordered_json choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr},
                                     {"finish_reason", t.last ? nlohmann::ordered_json("length") : nullptr}};
    nlohmann::ordered_json obj = {{"id", c.response_id}, {"object", "text_completion"}, {"created", c.created},
                                  {"model", "m"}, {"choices", nlohmann::ordered_json::array({choice})}};
    c.out += chunk("data: " + obj.dump() + "\n\n");
    if (t.last) {
      c.out += chunk("data: [DONE]\n\n") + "0\r\n\r\n";
      c.finished = true;
    }
    touched.push_back(t.conn);
  }
  for (uint64_t id : touched)
    if (auto it = conns_.find(id); it != conns_.end()) flush(*it->second);
}

void EpollSseServer::flush(Conn& c) {
  while (c.out_pos < c.out.size()) {
    ssize_t put = send(c.fd, c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
    if (put > 0) {
      c.out_pos += static_cast<size_t>(put);
      continue;
    }
    if (put < 0 && errno == EINTR) continue;
    if (put < 0 && errno == EAGAIN) {
      if (!c.want_out) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT;
        ev.data.u64 = c.id;
        epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
        c.want_out = true;
      }
      return;
    }
    if (c.stream != 0 && !c.finished) engine_.cancel(c.stream);
    close_conn(c.id);  // the client is gone
    return;
  }
  c.out.clear();
  c.out_pos = 0;
  if (c.want_out) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c.id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
    c.want_out = false;
  }
  if (c.finished) close_conn(c.id);
}

void EpollSseServer::close_conn(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  close(it->second->fd);  // also leaves the epoll set
  conns_.erase(it);
}

}  // namespace shardlm::bench
