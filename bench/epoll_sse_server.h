// The event-driven alternative for connections_bench: one thread, one
// epoll set, non-blocking sockets. It reads an HTTP/1.1 POST
// /v1/completions, parses its JSON body (max_tokens), submits to the same
// CadenceEngine the real server's bench backend uses, and writes each token
// as an OpenAI-shaped SSE chunk (chunked transfer encoding, as cpp-httplib
// writes them), then `data: [DONE]`. The engine thread queues tokens and
// wakes the loop through an eventfd once per step.
//
// Minimal on purpose: no keep-alive, no TLS, no auth, nothing but what a
// streaming completion needs. It exists to measure what an event loop
// would save, not to serve.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/cadence_engine.h"

namespace shardlm::bench {

class EpollSseServer {
 public:
  explicit EpollSseServer(CadenceEngine& engine);
  ~EpollSseServer();
  EpollSseServer(const EpollSseServer&) = delete;
  EpollSseServer& operator=(const EpollSseServer&) = delete;

  // Binds 127.0.0.1:port (0: any free port); throws std::runtime_error.
  void bind(int port);
  int port() const { return port_; }
  // Serves until the process ends.
  void run();

 private:
  struct Conn;
  struct Token {
    uint64_t conn;
    int64_t token;
    bool last;
  };
  void accept_all();
  void on_readable(Conn& c);
  void start_stream(Conn& c, const std::string& body);
  void reply_error(Conn& c, int status, const std::string& message);
  void deliver_tokens();
  void flush(Conn& c);
  void close_conn(uint64_t id);

  CadenceEngine& engine_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: the engine stepped
  int port_ = 0;
  uint64_t next_conn_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::mutex outbox_mutex_;
  std::vector<Token> outbox_;  // written by the engine thread, drained by the loop
};

}  // namespace shardlm::bench
