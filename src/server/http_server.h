// The OpenAI-compatible HTTP front end (cpp-httplib). HTTP threads parse and
// validate, post work to the backend, and relay its events; they never touch
// engine state.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "server/serving_backend.h"

namespace httplib {
class Server;
}

namespace shardlm::server {

class ConnectionServer;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8000;                 // 0: any free port (see HttpServer::port())
  std::vector<std::string> served_model_names;  // first is reported by /v1/models
  std::string api_key;             // empty: no authentication
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  size_t max_buffered_body_bytes = 64u << 20;  // bodies read before a worker takes them, all connections (GateLimits)
  int request_start_timeout_s = 60;  // a new connection silent this long gets 408
  size_t max_header_bytes = 64 * 1024;  // request line and header fields; more gets 431
  int n_http_threads = 1040;       // open connections served at once (threads start on demand); more wait in the accept queue
  RequestLimits limits;
  ApiOptions api;                  // tool-call / reasoning parsers, generation defaults
  std::vector<std::string> allowed_origins;  // CORS: "*" or exact origins; empty: no CORS headers
  // /v1/responses with store (the default): kept in memory, lost on restart;
  // past either bound the oldest responses are evicted.
  size_t responses_store_max_count = 1000;
  size_t responses_store_max_bytes = 64u << 20;
  std::string version = "0.0.0";
  bool web_ui = true;              // the page at / (--no-web-ui: 404)
};

class HttpServer {
 public:
  HttpServer(ServingBackend& backend, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; throws Error(kIo) naming host:port on failure.
  void bind();
  int port() const { return port_; }
  // Serves until stop(); returns when the listener has closed.
  void run();
  // Graceful stop: refuse new requests (503), let in-flight ones finish for
  // up to `grace`, abort the rest (finish_reason "abort"), then close.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(5000));
  size_t active_requests() const;
  // Connections waiting for a request (new, or kept alive between
  // requests): they hold no HTTP thread.
  size_t waiting_connections() const;
  size_t buffered_body_bytes() const;  // bodies read, not yet handed to a worker

 private:
  struct Streams;
  void install_routes();
  bool authorised(const std::string& authorization_header) const;
  void track(RequestStream* stream);
  void untrack(RequestStream* stream);

  ServingBackend& backend_;
  ServerOptions options_;
  std::unique_ptr<ConnectionServer> http_;
  int port_ = 0;
  std::shared_ptr<int> listen_fd_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> run_entered_{false};
  std::atomic<bool> run_returned_{false};
  mutable std::mutex active_mutex_;
  std::set<RequestStream*> active_;
};

}  // namespace shardlm::server
