// `shardlm router`: an OpenAI-compatible front for replicas on other hosts
// (shardlm serve, or any OpenAI-compatible server). Routes by least
// outstanding work with prefix affinity (RoutingPolicy), checks backend
// health, and retries a request on another replica when its backend cannot
// be reached, so a dead replica loses no request that has not started
// streaming.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/routing_policy.h"

namespace httplib {
class Server;
}

namespace shardlm::server {

class ConnectionServer;
struct RequestHead;

struct BackendAddress {
  std::string host;
  int port = 80;
  std::string url;  // as given, for messages
};

// "http://10.0.0.2:8000" -> {host, port}; throws Error(kInvalidArgument) for
// anything else (https is not supported: terminate TLS in front).
BackendAddress parse_backend_url(const std::string& url);

struct RouterOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> backends;  // base URLs
  std::string api_key;                // checked here, and passed on to the backends
  int health_interval_ms = 2000;
  int max_attempts = 3;               // per request, over different backends
  int n_http_threads = 2048;          // open client connections served at once (threads start on demand)
  size_t max_body_bytes = 8u << 20;
  int request_start_timeout_s = 60;   // a new connection silent this long gets 408
  size_t max_header_bytes = 64 * 1024;  // request line and header fields; more gets 431
  RoutingOptions routing;
  bool web_ui = true;                 // the page at / (--no-web-ui: 404)
};

class Router {
 public:
  explicit Router(RouterOptions options);
  ~Router();
  void bind();
  int port() const { return port_; }
  void run();
  void stop();
  // Counters for tests and /metrics.
  int64_t requests_to(int backend) const { return requests_[backend]; }
  int64_t retries() const { return retries_; }
  bool backend_healthy(int backend) const { return policy_.healthy(backend); }
  void check_health_now();

 private:
  struct Relay;  // one forwarded request: the client side and its upstream reader
  void install_routes();
  // The raw Authorization field is exactly "Bearer <--api-key>" (or no key is set);
  // /health and /metrics need none.
  bool authorised(const RequestHead& head) const;
  void health_loop();

  RouterOptions options_;
  std::vector<BackendAddress> backends_;
  RoutingPolicy policy_;
  std::unique_ptr<ConnectionServer> http_;
  int port_ = 0;
  std::shared_ptr<int> listen_fd_;
  std::unique_ptr<std::atomic<int64_t>[]> requests_;
  std::unique_ptr<std::atomic<int>[]> health_misses_;  // health checks in a row with no answer, per backend
  static constexpr int kHealthMissesBeforeDown = 3;
  std::atomic<int64_t> retries_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int> upstream_threads_{0};
  std::mutex relays_mutex_;
  std::set<Relay*> relays_;  // with a running upstream reader
  std::mutex health_mutex_;
  std::condition_variable health_cv_;
  std::thread health_thread_;
};

}  // namespace shardlm::server
