#include "server/router.h"

#include <httplib.h>
#include <openssl/crypto.h>

#include <deque>
#include <future>
#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/bounded_json.h"
#include "server/connection_server.h"
#include "server/deployment.h"
#include "server/listener.h"
#include "server/openai_protocol.h"
#include "server/web_ui.h"

namespace shardlm::server {

BackendAddress parse_backend_url(const std::string& url) {
  static const std::regex re(R"(^http://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\])(:([0-9]{1,5}))?/?$)");
  std::smatch m;
  if (!std::regex_match(url, m, re))
    fail(ErrorCode::kInvalidArgument, "--backend '", url, "' must look like http://HOST:PORT (https is not supported; terminate TLS in front)");
  BackendAddress a;
  a.host = m[1].str();
  if (a.host.front() == '[') a.host = a.host.substr(1, a.host.size() - 2);
  a.port = m[3].matched ? std::stoi(m[3].str()) : 80;
  if (a.port < 1 || a.port > 65535) fail(ErrorCode::kInvalidArgument, "--backend '", url, "': port must be 1-65535");
  a.url = url;
  return a;
}

namespace {

void reply_error(httplib::Response& res, int status, const std::string& message, const std::string& type) {
  res.status = status;
  res.set_content(error_json({status, message, type, "", ""}).dump(), "application/json");
}

// The prompt text that decides affinity, and a cost estimate in tokens.
// Returns false for a body nested too deep to touch (refused here, as serve
// would: nlohmann's dump() recurses per level).
bool describe(const std::string& body, std::string* prompt, int64_t* cost) {
  *cost = 256;
  if (json_nesting_depth(body, kMaxJsonDepth) > kMaxJsonDepth) return false;
  try {
    auto j = parse_bounded_json(body, "the request body");
    if (auto m = j.find("messages"); m != j.end() && m->is_array()) {
      for (const auto& msg : *m) {
        if (!msg.is_object()) continue;
        *prompt += msg.value("role", "") + "\n";
        if (msg.contains("content") && msg["content"].is_string()) *prompt += msg["content"].get<std::string>() + "\n";
      }
    } else if (auto p = j.find("prompt"); p != j.end()) {
      *prompt = p->is_string() ? p->get<std::string>() : p->dump();
    } else if (auto in = j.find("input"); in != j.end()) {  // /v1/responses
      *prompt = j.value("instructions", std::string()) + "\n" + (in->is_string() ? in->get<std::string>() : in->dump());
    }
    int64_t max_tokens = 256;
    for (const char* k : {"max_tokens", "max_completion_tokens", "max_output_tokens"})
      if (j.contains(k) && j[k].is_number_integer()) max_tokens = j[k].get<int64_t>();
    *cost = static_cast<int64_t>(prompt->size() / 4) + std::clamp<int64_t>(max_tokens, 1, 1 << 20);
  } catch (const std::exception&) {
    // The backend will answer the malformed body with its own 400.
  }
  return true;
}

httplib::Headers forward_headers(const httplib::Request& req) {
  httplib::Headers h;
  // Anthropic's clients authenticate with x-api-key and name the API version they speak.
  for (const char* name : {"Authorization", "x-api-key", "anthropic-version", "anthropic-beta"})
    if (req.has_header(name)) h.emplace(name, req.get_header_value(name));
  return h;
}

}  // namespace

// Shared between the HTTP thread relaying a stream and the thread reading it
// from the backend.
struct Router::Relay {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::string> chunks;
  int status = 0;          // upstream status, once its headers arrived
  std::string content_type;
  bool upstream_done = false;
  bool failed = false;     // no backend could be reached
  std::string failure;
  std::atomic<bool> client_gone{false};
  httplib::Client* upstream = nullptr;  // the backend connection in use (under mutex)
  // The client left, or the router stops: close the backend connection, so
  // the backend notices at once and frees the request's KV.
  void cut() {
    std::lock_guard<std::mutex> lock(mutex);
    client_gone = true;
    if (upstream) upstream->stop();
  }
};

Router::Router(RouterOptions options)
    : options_(std::move(options)), policy_(options_.backends.size(), options_.routing),
      http_(std::make_unique<ConnectionServer>(static_cast<size_t>(std::max(2, options_.n_http_threads)))) {
  if (options_.backends.empty()) fail(ErrorCode::kInvalidArgument, "router: give at least one --backend URL");
  for (const auto& url : options_.backends) backends_.push_back(parse_backend_url(url));
  requests_ = std::make_unique<std::atomic<int64_t>[]>(backends_.size());
  health_misses_ = std::make_unique<std::atomic<int>[]>(backends_.size());
  for (size_t i = 0; i < backends_.size(); ++i) health_misses_[i] = 0;
  for (size_t i = 0; i < backends_.size(); ++i) requests_[i] = 0;
  http_->set_payload_max_length(options_.max_body_bytes);
  // As serve: a slow client's request is waited for, not closed after
  // httplib's 5 s defaults.
  GateLimits gate;
  gate.start_timeout = std::chrono::seconds(options_.request_start_timeout_s);
  gate.max_head_bytes = options_.max_header_bytes;
  gate.max_body_bytes = options_.max_body_bytes;
  http_->set_gate_limits(gate);
  http_->set_head_check([this](const RequestHead& head) -> std::optional<EarlyAnswer> {
    if (head.method == "OPTIONS" || authorised(head)) return std::nullopt;
    return EarlyAnswer{401, openai_error_body("Incorrect or missing API key", "authentication_error", "invalid_api_key"), {}};
  });
  listen_fd_ = configure_listener(*http_);
  install_routes();
}

Router::~Router() { stop(); }

void Router::bind() {
  port_ = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                             : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ < 0) fail(ErrorCode::kIo, "cannot listen on ", options_.host, ":", options_.port, " (choose another --port)");
  widen_backlog(listen_fd_);
  check_health_now();
  health_thread_ = std::thread([this] { health_loop(); });
}

void Router::run() { http_->listen_after_bind(); }

void Router::stop() {
  stopping_ = true;
  health_cv_.notify_all();
  if (health_thread_.joinable()) health_thread_.join();
  if (http_->is_running()) http_->stop();
  // Upstream readers hold `this`: close their backend connections so each
  // returns now, and wait for the last one before the router goes away.
  const auto t0 = std::chrono::steady_clock::now();
  bool warned = false;
  while (upstream_threads_ > 0) {
    {
      std::lock_guard<std::mutex> lock(relays_mutex_);
      for (Relay* r : relays_) r->cut();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!warned && std::chrono::steady_clock::now() - t0 > std::chrono::seconds(10)) {
      std::fprintf(stderr, "shardlm router: still waiting for %d upstream connections to close\n", upstream_threads_.load());
      warned = true;
    }
  }
}

void Router::check_health_now() {
  for (size_t i = 0; i < backends_.size(); ++i) {
    httplib::Client c(backends_[i].host, backends_[i].port);
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(2, 0);
    auto r = c.Get("/health");
    // An answer is definitive (503: its executor is down). No answer within
    // the timeouts may be a loaded backend: down after kHealthMissesBeforeDown
    // in a row, not at the first.
    if (r) {
      health_misses_[i] = 0;
      policy_.set_healthy(static_cast<int>(i), r->status == 200);
    } else if (++health_misses_[i] >= kHealthMissesBeforeDown) {
      policy_.set_healthy(static_cast<int>(i), false);
    }
  }
}

void Router::health_loop() {
  std::unique_lock<std::mutex> lock(health_mutex_);
  while (!stopping_) {
    health_cv_.wait_for(lock, std::chrono::milliseconds(options_.health_interval_ms));
    if (stopping_) break;
    lock.unlock();
    check_health_now();
    lock.lock();
  }
}

bool Router::authorised(const RequestHead& head) const {
  if (options_.api_key.empty() || head.path == "/health" || head.path == "/metrics") return true;
  if (options_.web_ui && head.method == "GET" && find_web_asset(head.path)) return true;  // the page asks for the key
  const std::string want = "Bearer " + options_.api_key;
  // Anthropic's clients send the key as x-api-key, OpenAI's as a bearer token.
  return secret_equals(head.field("authorization").value_or(""), want) ||
         secret_equals("Bearer " + head.field("x-api-key").value_or(""), want);
}

void Router::install_routes() {
  using httplib::Request;
  using httplib::Response;

  // The gate refused unauthorised heads; this holds should a request reach
  // the handlers some other way.
  http_->set_pre_routing_handler([this](const Request& req, Response& res) {
    const RequestHead* head = ConnectionServer::current_head();
    if (head != nullptr && authorised(*head)) return httplib::Server::HandlerResponse::Unhandled;
    if (head == nullptr && options_.api_key.empty()) return httplib::Server::HandlerResponse::Unhandled;
    reply_error(res, 401, "Incorrect or missing API key", "authentication_error");
    return httplib::Server::HandlerResponse::Handled;
  });

  http_->Get("/health", [this](const Request&, Response& res) {
    for (size_t i = 0; i < backends_.size(); ++i)
      if (policy_.healthy(static_cast<int>(i))) return void(res.status = 200);
    reply_error(res, 503, "no healthy backend", "service_unavailable");
  });

  http_->Get("/metrics", [this](const Request&, Response& res) {
    std::string out = "# TYPE shardlm_router_requests_total counter\n";
    for (size_t i = 0; i < backends_.size(); ++i)
      out += str_cat("shardlm_router_requests_total{backend=\"", backends_[i].url, "\"} ", requests_[i].load(), "\n");
    out += "# TYPE shardlm_router_backend_healthy gauge\n";
    for (size_t i = 0; i < backends_.size(); ++i)
      out += str_cat("shardlm_router_backend_healthy{backend=\"", backends_[i].url, "\"} ",
                     policy_.healthy(static_cast<int>(i)) ? 1 : 0, "\n");
    out += str_cat("# TYPE shardlm_router_retries_total counter\nshardlm_router_retries_total ", retries_.load(), "\n");
    res.set_content(out, "text/plain; version=0.0.4");
  });

  // GET endpoints go to any healthy backend.
  auto forward_get = [this](const Request& req, Response& res) {
    for (size_t i = 0; i < backends_.size(); ++i) {
      if (!policy_.healthy(static_cast<int>(i))) continue;
      httplib::Client c(backends_[i].host, backends_[i].port);
      c.set_connection_timeout(2, 0);
      auto r = c.Get(req.path.c_str(), forward_headers(req));
      if (!r) continue;
      res.status = r->status;
      res.set_content(r->body, r->get_header_value("Content-Type").c_str());
      return;
    }
    reply_error(res, 503, "no healthy backend", "service_unavailable");
  };
  http_->Get("/v1/models", forward_get);
  if (options_.web_ui) install_web_ui(*http_);
  // Every healthy backend's deployment, as the replicas of one picture.
  http_->Get("/v1/deployment", [this](const Request& req, Response& res) {
    std::vector<nlohmann::ordered_json> parts;
    for (size_t i = 0; i < backends_.size(); ++i) {
      if (!policy_.healthy(static_cast<int>(i))) continue;
      httplib::Client c(backends_[i].host, backends_[i].port);
      c.set_connection_timeout(2, 0);
      auto r = c.Get("/v1/deployment", forward_headers(req));
      if (r && r->status == 200) parts.push_back(parse_bounded_json(r->body, "a backend's deployment"));
    }
    if (parts.empty()) return reply_error(res, 503, "no healthy backend described its deployment", "service_unavailable");
    res.set_content(merge_deployments(parts).dump(), "application/json");
  });
  http_->Get("/version", forward_get);

  // A stored response lives on the backend that answered it: ask each
  // healthy backend until one has it (a 404 from all is the answer).
  auto forward_stored = [this](const Request& req, Response& res) {
    bool asked = false;
    for (size_t i = 0; i < backends_.size(); ++i) {
      if (!policy_.healthy(static_cast<int>(i))) continue;
      httplib::Client c(backends_[i].host, backends_[i].port);
      c.set_connection_timeout(2, 0);
      auto r = req.method == "DELETE" ? c.Delete(req.path.c_str(), forward_headers(req)) : c.Get(req.path.c_str(), forward_headers(req));
      if (!r) continue;
      asked = true;
      res.status = r->status;
      res.set_content(r->body, r->get_header_value("Content-Type").c_str());
      if (r->status != 404) return;
    }
    if (!asked) reply_error(res, 503, "no healthy backend", "service_unavailable");
  };
  http_->Get(R"(/v1/responses/([^/]+))", forward_stored);
  http_->Delete(R"(/v1/responses/([^/]+))", forward_stored);

  auto forward_post = [this](const Request& req, Response& res) {
    std::string prompt;
    int64_t cost = 0;
    if (!describe(req.body, &prompt, &cost))
      return reply_error(res, 400, str_cat("the request body is nested deeper than ", kMaxJsonDepth,
                                           " levels (the limit on JSON nesting)"), "invalid_request_error");
    const std::string content_type = req.get_header_value("Content-Type");
    const httplib::Headers headers = forward_headers(req);
    auto relay = std::make_shared<Relay>();
    const std::string path = req.path;
    const std::string body = req.body;
    {
      // Registered before stopping_ is checked again, so stop() cuts it.
      std::lock_guard<std::mutex> lock(relays_mutex_);
      if (stopping_) return reply_error(res, 503, "the router is shutting down", "service_unavailable");
      relays_.insert(relay.get());
      ++upstream_threads_;
    }

    // The upstream reader: tries backends until one answers, then pumps its
    // bytes into the relay. A backend that fails before answering is marked
    // unhealthy and the request moves on; nothing was sent to the client yet.
    std::thread([this, relay, prompt, cost, content_type, headers, path, body] {
      struct Done {
        Router* router;
        Relay* relay;
        ~Done() {
          {
            std::lock_guard<std::mutex> lock(router->relays_mutex_);
            router->relays_.erase(relay);
          }
          --router->upstream_threads_;
        }
      } done{this, relay.get()};
      std::vector<int> tried;
      for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
        if (relay->client_gone) break;
        int b = policy_.acquire(prompt, cost, tried);
        // Health is a preference, not a verdict: with every healthy backend
        // tried, a loaded one may still answer, and a dead one fails fast.
        if (b < 0) b = policy_.acquire(prompt, cost, tried, /*any_health=*/true);
        if (b < 0) break;
        tried.push_back(b);
        if (attempt > 0) ++retries_;
        ++requests_[b];
        httplib::Client c(backends_[b].host, backends_[b].port);
        c.set_connection_timeout(2, 0);
        c.set_read_timeout(3600, 0);
        httplib::Request up;
        up.method = "POST";
        up.path = path;
        up.headers = headers;
        up.body = body;
        up.set_header("Content-Type", content_type);
        bool answered = false;
        int refused = 0;  // a 5xx before any byte reached the client: try another backend
        const bool last_attempt = attempt + 1 >= options_.max_attempts;
        up.response_handler = [&](const httplib::Response& r) {
          if (r.status >= 500 && r.status != 501 && !last_attempt) {
            refused = r.status;
            return false;
          }
          std::lock_guard<std::mutex> lock(relay->mutex);
          relay->status = r.status;
          relay->content_type = r.get_header_value("Content-Type");
          answered = true;
          relay->cv.notify_all();
          return true;
        };
        up.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
          std::lock_guard<std::mutex> lock(relay->mutex);
          relay->chunks.emplace_back(data, n);
          relay->cv.notify_all();
          return !relay->client_gone.load();
        };
        {
          std::lock_guard<std::mutex> lock(relay->mutex);
          if (relay->client_gone) {
            policy_.release(b, cost);
            break;
          }
          relay->upstream = &c;
        }
        auto result = c.send(up);
        {
          std::lock_guard<std::mutex> lock(relay->mutex);
          relay->upstream = nullptr;
        }
        policy_.release(b, cost);
        if (refused) {
          // 503: its executor is down or restarting; the health loop brings it back.
          if (refused == 503) policy_.set_healthy(b, false);
          continue;
        }
        if (!result && !answered) {
          policy_.set_healthy(b, false);  // the health loop brings it back
          continue;
        }
        std::lock_guard<std::mutex> lock(relay->mutex);
        if (!result && !relay->client_gone) {
          // The backend died mid-response: tell a streaming client.
          relay->chunks.emplace_back("data: " + error_json({502, "the backend " + backends_[b].url + " failed mid-response",
                                                            "bad_gateway", "", ""}).dump() + "\n\n");
        }
        relay->upstream_done = true;
        relay->cv.notify_all();
        return;
      }
      std::lock_guard<std::mutex> lock(relay->mutex);
      relay->failed = true;
      relay->failure = tried.empty() ? "no healthy backend" : str_cat("no backend answered after ", tried.size(), " attempts");
      relay->upstream_done = true;
      relay->cv.notify_all();
    }).detach();

    // Until the answer is complete nothing is written to the client, so its
    // hang-up is seen on its socket: the backend connection is cut then.
    auto wait_watching_client = [&](std::unique_lock<std::mutex>& lock, auto ready) {
      while (!relay->cv.wait_for(lock, std::chrono::milliseconds(50), ready)) {
        if (ConnectionServer::current_client_gone()) {
          lock.unlock();
          relay->cut();
          lock.lock();
          return false;
        }
      }
      return true;
    };
    std::unique_lock<std::mutex> lock(relay->mutex);
    if (!wait_watching_client(lock, [&] { return relay->status != 0 || relay->upstream_done; })) {
      res.status = 499;  // nobody reads it
      return;
    }
    if (relay->failed) {
      res.set_header("Retry-After", "1");
      return reply_error(res, 503, relay->failure, "service_unavailable");
    }
    const bool streaming = relay->content_type.rfind("text/event-stream", 0) == 0;
    if (!streaming || relay->status != 200) {
      if (!wait_watching_client(lock, [&] { return relay->upstream_done; })) {
        res.status = 499;
        return;
      }
      std::string all;
      for (auto& c : relay->chunks) all += c;
      res.status = relay->status;
      res.set_content(all, relay->content_type.empty() ? "application/json" : relay->content_type.c_str());
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [relay](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> lock(relay->mutex);
          relay->cv.wait_for(lock, std::chrono::milliseconds(100),
                             [&] { return !relay->chunks.empty() || relay->upstream_done; });
          while (!relay->chunks.empty()) {
            std::string chunk = std::move(relay->chunks.front());
            relay->chunks.pop_front();
            if (!sink.write(chunk.data(), chunk.size())) {
              lock.unlock();
              relay->cut();
              return false;
            }
          }
          if (relay->upstream_done) {
            sink.done();
            return true;
          }
          if (!sink.is_writable() || ConnectionServer::current_client_gone()) {
            lock.unlock();
            relay->cut();
            return false;
          }
          return true;
        },
        [relay](bool) { relay->cut(); });
  };
  http_->Post("/v1/chat/completions", forward_post);
  http_->Post("/v1/completions", forward_post);
  http_->Post("/v1/messages", forward_post);
  http_->Post("/v1/messages/count_tokens", forward_post);
  http_->Post("/v1/responses", forward_post);
  http_->Post("/tokenize", forward_post);
  http_->Post("/detokenize", forward_post);
}

}  // namespace shardlm::server
