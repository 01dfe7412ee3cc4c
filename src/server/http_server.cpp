#include "server/http_server.h"

#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>


#include <algorithm>
#include <ctime>
#include <thread>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/anthropic_messages.h"
#include "server/bounded_json.h"
#include "server/connection_server.h"
#include "server/responses_api.h"
#include "server/listener.h"
#include "server/web_ui.h"

namespace shardlm::server {

namespace {

void reply_json(httplib::Response& res, int status, const ordered_json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

void reply_error(httplib::Response& res, const ApiError& error) { reply_json(res, error.status, error_json(error)); }

const char* status_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "internal_server_error" : "invalid_request_error";
  }
}

std::array<unsigned char, 32> sha256(const std::string& s) {
  std::array<unsigned char, 32> out{};
  unsigned int len = 0;
  EVP_Digest(s.data(), s.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

// CORS (--allowed-origins): an allowed Origin gets Access-Control-Allow-Origin
// on every answer; an OPTIONS preflight is answered here (before auth, as
// browsers send it without credentials). Returns true when it answered.
bool cors(const std::vector<std::string>& allowed, const httplib::Request& req, httplib::Response& res) {
  const std::string origin = req.get_header_value("Origin");
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  const bool ok = !origin.empty() && (any || std::find(allowed.begin(), allowed.end(), origin) != allowed.end());
  if (ok) {
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) res.set_header("Vary", "Origin");
  }
  if (req.method != "OPTIONS") return false;
  if (!ok) {
    res.status = 403;
    res.set_content(error_json({403, origin.empty() ? "OPTIONS is only answered as a CORS preflight (send Origin)"
                                                    : "origin '" + origin + "' is not allowed (see --allowed-origins)",
                                "permission_error", "", ""}).dump(), "application/json");
    return true;
  }
  res.status = 204;
  res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
  const std::string asked = req.get_header_value("Access-Control-Request-Headers");
  res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
  res.set_header("Access-Control-Max-Age", "600");
  return true;
}

// "application/json", any case, optionally with parameters ("; charset=utf-8");
// not a prefix match, which would take application/jsonp.
bool is_json_media_type(const std::string& header) {
  std::string type = header.substr(0, header.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.erase(0, 1);
  std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return type == "application/json";
}

// A header field as the client sent it (httplib URL-decodes values).
std::string raw_field(const httplib::Request& req, const std::string& lower_name) {
  if (const RequestHead* head = ConnectionServer::current_head()) return head->field(lower_name).value_or("");
  return req.get_header_value(lower_name.c_str());
}

bool needs_auth(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize" || path == "/tokenizer_info";
}

}  // namespace

// The backend requests of one HTTP request. Whatever way the handler exits
// (answer sent, client gone, exception), unfinished requests are cancelled
// and the server stops tracking them.
struct HttpServer::Streams {
  HttpServer* server;
  std::vector<std::unique_ptr<RequestStream>> list;
  explicit Streams(HttpServer* s) : server(s) {}
  void add(std::unique_ptr<RequestStream> s) {
    server->track(s.get());
    list.push_back(std::move(s));
  }
  ~Streams() {
    for (auto& s : list) {
      if (!s->done()) s->cancel();
      server->untrack(s.get());
    }
  }
};

namespace {

bool sse_write(httplib::DataSink& sink, const std::string& payload) {
  std::string frame = "data: " + payload + "\n\n";
  return sink.write(frame.data(), frame.size());
}

}  // namespace

HttpServer::HttpServer(ServingBackend& backend, ServerOptions options)
    : backend_(backend), options_(std::move(options)),
      http_(std::make_unique<ConnectionServer>(static_cast<size_t>(std::max(2, options_.n_http_threads)))) {
  if (options_.served_model_names.empty()) options_.served_model_names.push_back("model");
  http_->set_payload_max_length(options_.max_body_bytes);
  GateLimits gate;
  gate.start_timeout = std::chrono::seconds(options_.request_start_timeout_s);
  gate.max_head_bytes = options_.max_header_bytes;
  gate.max_body_bytes = options_.max_body_bytes;
  gate.max_buffered_body_bytes = options_.max_buffered_body_bytes;
  http_->set_gate_limits(gate);
  http_->set_arrivals(backend_.arrivals());
  // Refused from the head alone, before a byte of the body is read.
  http_->set_head_check([this](const RequestHead& head) -> std::optional<EarlyAnswer> {
    if (head.method == "OPTIONS") return std::nullopt;  // CORS preflight: the pre-routing handler answers
    if (draining_ && head.path != "/health")
      return EarlyAnswer{503, openai_error_body("the server is shutting down", "service_unavailable", "shutting_down"), {}};
    if (needs_auth(head.path) && !authorised(head.field("authorization").value_or("")) &&
        !authorised("Bearer " + head.field("x-api-key").value_or(""))) {
      if (is_anthropic_path(head.path))
        return EarlyAnswer{401,
                           anthropic_error_json(401, "invalid x-api-key: pass the server's --api-key as 'x-api-key: <key>'")
                               .dump(),
                           {}};
      return EarlyAnswer{401,
                         openai_error_body("Incorrect or missing API key: pass it as 'Authorization: Bearer <key>'",
                                           "authentication_error", "invalid_api_key"),
                         {}};
    }
    return std::nullopt;
  });
  http_->set_tcp_nodelay(true);
  listen_fd_ = configure_listener(*http_);
  install_routes();
}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

bool HttpServer::authorised(const std::string& header) const {
  if (options_.api_key.empty()) return true;
  const std::string prefix = "Bearer ";
  std::string given = header.rfind(prefix, 0) == 0 ? header.substr(prefix.size()) : std::string();
  // Compare digests in constant time: neither the key's length nor its
  // matching prefix leaks through timing.
  auto a = sha256(given);
  auto b = sha256(options_.api_key);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0 && !given.empty();
}

void HttpServer::track(RequestStream* s) {
  std::lock_guard<std::mutex> lock(active_mutex_);
  active_.insert(s);
}

void HttpServer::untrack(RequestStream* s) {
  std::lock_guard<std::mutex> lock(active_mutex_);
  active_.erase(s);
}

size_t HttpServer::active_requests() const {
  std::lock_guard<std::mutex> lock(active_mutex_);
  return active_.size();
}

size_t HttpServer::waiting_connections() const { return http_->n_waiting_connections(); }

size_t HttpServer::buffered_body_bytes() const { return http_->n_buffered_body_bytes(); }

void HttpServer::bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
  } else {
    port_ = http_->bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ < 0)
    fail(ErrorCode::kIo, "cannot listen on ", options_.host, ":", options_.port,
         " (is another server using the port? choose another with --port)");
  widen_backlog(listen_fd_);
}

void HttpServer::run() {
  run_entered_ = true;
  if (!draining_) http_->listen_after_bind();
  run_returned_ = true;
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  draining_ = true;
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (active_requests() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    std::lock_guard<std::mutex> lock(active_mutex_);
    for (RequestStream* s : active_) s->cancel();
  }
  // Aborted streams still send their last chunk ("abort") and [DONE].
  auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (active_requests() > 0 && std::chrono::steady_clock::now() < flush_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // run() may be on its way into the listen loop: wait until it is inside
  // (or gave up on seeing draining_), so stop() cannot be missed.
  auto start_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (run_entered_ && !run_returned_ && !http_->is_running() && std::chrono::steady_clock::now() < start_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (http_->is_running()) http_->stop();
}

void HttpServer::install_routes() {
  using httplib::Request;
  using httplib::Response;
  auto& http = *http_;

  http.set_pre_routing_handler([this](const Request& req, Response& res) {
    if (cors(options_.allowed_origins, req, res)) return httplib::Server::HandlerResponse::Handled;  // an OPTIONS preflight
    if (draining_ && req.path != "/health") {
      reply_error(res, {503, "the server is shutting down", "service_unavailable", "", "shutting_down"});
      return httplib::Server::HandlerResponse::Handled;
    }
    // Anthropic's clients send the key as x-api-key, OpenAI's as a bearer token: either will do.
    if (needs_auth(req.path) && !authorised(raw_field(req, "authorization")) &&
        !authorised("Bearer " + raw_field(req, "x-api-key"))) {
      if (is_anthropic_path(req.path)) {
        reply_json(res, 401, anthropic_error_json(401, "invalid x-api-key: pass the server's --api-key as 'x-api-key: <key>'"));
        return httplib::Server::HandlerResponse::Handled;
      }
      reply_error(res, {401, "Incorrect or missing API key: pass it as 'Authorization: Bearer <key>'",
                        "authentication_error", "", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Errors that httplib raises itself (404 route, 413 body, 400 framing)
  // get an OpenAI-shaped body too.
  http.set_error_handler([this](const Request& req, Response& res) {
    if (!res.body.empty()) return;
    std::string message;
    if (res.status == 404) message = "no route for " + req.method + " " + req.path;
    else if (res.status == 413) message = str_cat("the request body exceeds the limit of ", options_.max_body_bytes, " bytes");
    else message = str_cat("HTTP error ", res.status);
    if (is_anthropic_path(req.path)) return reply_json(res, res.status, anthropic_error_json(res.status, message));
    reply_error(res, {res.status, message, status_type(res.status), "", ""});
  });

  http.set_exception_handler([](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, {500, what, "internal_server_error", "", ""});
  });

  http.Get("/health", [this](const Request&, Response& res) {
    if (draining_ || !backend_.ready()) {
      reply_error(res, {503, draining_ ? "shutting down" : "the model is still loading", "service_unavailable", "", ""});
      return;
    }
    if (std::string down = backend_.health_error(); !down.empty()) {
      reply_error(res, {503, "the model executor is down: " + down, "service_unavailable", "", "executor_down"});
      return;
    }
    res.status = 200;
  });

  http.Get("/version", [this](const Request&, Response& res) { reply_json(res, 200, {{"version", options_.version}}); });

  http.Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(backend_.metrics(), "text/plain; version=0.0.4; charset=utf-8");
  });

  http.Get("/v1/models", [this](const Request&, Response& res) {
    ordered_json data = ordered_json::array();
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    for (const auto& name : options_.served_model_names) {
      data.push_back({{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "shardlm"},
                      {"root", options_.served_model_names[0]}, {"parent", nullptr},
                      {"max_model_len", backend_.ready() ? backend_.max_model_len() : 0}});
    }
    reply_json(res, 200, {{"object", "list"}, {"data", data}});
  });

  if (options_.web_ui) install_web_ui(http);
  http.Get("/v1/deployment", [this](const Request&, Response& res) {
    Deployment d = backend_.deployment();
    if (!d.available) return reply_error(res, {503, "the deployment is not known yet (the model is loading)", "service_unavailable", "", "model_loading"});
    reply_json(res, 200, deployment_json(d));
  });

  auto json_body = [](const Request& req) {
    std::string type = req.get_header_value("Content-Type");
    if (!is_json_media_type(type))
      throw ApiException({415, "Content-Type must be application/json, got '" + brief_text(type) + "'",
                          "invalid_request_error", "", ""});
    ordered_json body = parse_bounded_json(req.body, "the request body");
    if (!body.is_object()) throw ApiException({400, "the request body must be a JSON object", "invalid_request_error", "", ""});
    return body;
  };

  auto guarded = [this](auto&& fn) {
    return [this, fn](const Request& req, Response& res) {
      try {
        if (!backend_.ready())
          throw ApiException({503, "the model is still loading; retry shortly", "service_unavailable", "", "model_loading"});
        if (std::string down = backend_.health_error(); !down.empty())
          throw ApiException({503, "the model executor is down: " + down, "service_unavailable", "", "executor_down"});
        fn(req, res);
      } catch (const ApiException& e) {
        reply_error(res, e.error());
      } catch (const Error& e) {
        int status = e.code() == ErrorCode::kInvalidArgument ? 400 : 500;
        reply_error(res, {status, e.what(), status_type(status), "", ""});
      } catch (const nlohmann::json::exception& e) {
        // A reader that took a client's value for the type it expected
        // (type_error) or an index it lacked (out_of_range): the request's
        // fault, not ours. The readers name their field; this is the net.
        reply_error(res, {400, "a request field has the wrong type: " + brief_text(e.what(), 200), "invalid_request_error", "", ""});
      } catch (const std::exception& e) {
        reply_error(res, {500, e.what(), "internal_server_error", "", ""});
      }
    };
  };

  http.Post("/tokenize", guarded([this, json_body](const Request& req, Response& res) {
    ordered_json body = json_body(req);
    // vLLM's /tokenize fields: return_token_strs is served (each token's
    // vocabulary string); continue_final_message is not implemented, so refused.
    bool token_strs = false;
    if (auto r = body.find("return_token_strs"); r != body.end() && !r->is_null()) {
      if (!r->is_boolean())
        throw ApiException({400, "'return_token_strs' must be true or false, got " + brief_json(*r),
                            "invalid_request_error", "return_token_strs", ""});
      token_strs = r->get<bool>();
    }
    body.erase("return_token_strs");
    if (auto c = body.find("continue_final_message"); c != body.end() && !c->is_null()) {
      if (!(c->is_boolean() && !c->get<bool>()))
        throw ApiException({400, "'continue_final_message' is not supported by /tokenize", "invalid_request_error",
                            "continue_final_message", "unsupported_parameter"});
      body.erase("continue_final_message");
    }
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
      ApiOptions api = options_.api;
      api.check_fields = false;  // /tokenize takes add_special_tokens and the like
      ParsedRequest parsed = parse_request(Endpoint::kChat, std::move(body), backend_, options_.limits, api);
      ids = parsed.prompts.at(0).prompt_ids;
    } else {
      auto p = body.find("prompt");
      if (p == body.end() || !p->is_string())
        throw ApiException({400, "'prompt' (a string) or 'messages' is required", "invalid_request_error", "prompt", ""});
      auto special = body.find("add_special_tokens");
      if (special != body.end() && !special->is_boolean() && !special->is_null())
        throw ApiException({400, "'add_special_tokens' must be true or false, got " + brief_json(*special),
                            "invalid_request_error", "add_special_tokens", ""});
      bool add_special = special == body.end() || !special->is_boolean() || special->get<bool>();
      ids = backend_.tokenize(p->get<std::string>(), add_special);
    }
    ordered_json out = {{"count", ids.size()}, {"max_model_len", backend_.max_model_len()}, {"tokens", ids}};
    if (token_strs) out["token_strs"] = backend_.token_strings(ids);
    reply_json(res, 200, out);
  }));

  // vLLM's GET /tokenizer_info, reduced to what shardlm knows of its tokenizer.
  http.Get("/tokenizer_info", guarded([this](const Request&, Response& res) {
    reply_json(res, 200, {{"vocab_size", backend_.vocab_size()}, {"model_max_length", backend_.max_model_len()}});
  }));

  http.Post("/detokenize", guarded([this, json_body](const Request& req, Response& res) {
    ordered_json body = json_body(req);
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array())
      throw ApiException({400, "'tokens' (a list of token ids) is required", "invalid_request_error", "tokens", ""});
    std::vector<int32_t> ids;
    for (const auto& x : *t) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
        throw ApiException({400, "'tokens' must hold non-negative integers", "invalid_request_error", "tokens", ""});
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    reply_json(res, 200, {{"prompt", backend_.detokenize(ids)}});
  }));

  auto generate = [this, json_body](Endpoint endpoint) {
    return [this, json_body, endpoint](const Request& req, Response& res) {
      // Content type and shape first; the body is parsed once.
      ParsedRequest parsed = parse_request(endpoint, json_body(req), backend_, options_.limits, options_.api);
      const auto& names = options_.served_model_names;
      if (!parsed.model.empty() && std::find(names.begin(), names.end(), parsed.model) == names.end())
        throw ApiException({404, "The model `" + parsed.model + "` does not exist.", "not_found_error", "model", "model_not_found"});
      const std::string model = parsed.model.empty() ? names[0] : parsed.model;
      const std::string id = new_request_id(endpoint);
      const int64_t created = static_cast<int64_t>(std::time(nullptr));

      // One backend request per prompt; all share the response id.
      auto tracked = std::make_shared<Streams>(this);
      auto* streams = &tracked->list;
      for (size_t i = 0; i < parsed.prompts.size(); ++i) {
        parsed.prompts[i].request_id = id + "-" + std::to_string(i);
        tracked->add(backend_.submit(parsed.prompts[i]));
      }
      const int n = parsed.prompts.empty() ? 1 : parsed.prompts[0].n;

      if (!parsed.stream) {
        std::vector<std::vector<ChoiceResult>> results(streams->size(), std::vector<ChoiceResult>(n));
        Usage usage;
        std::string error;
        // Nothing is written until the answer is complete, so a client that
        // gives up is noticed on its connection's socket (POLLRDHUP): its
        // requests are cancelled then, freeing their KV blocks.
        for (size_t p = 0; p < streams->size(); ++p) {
          RequestStream& s = *(*streams)[p];
          std::vector<GenerateEvent> events;
          while (!s.done()) {
            if (ConnectionServer::current_client_gone()) {
              for (auto& other : *streams) other->cancel();
              res.status = 499;  // nobody reads it; the client closed the request
              return;
            }
            events.clear();
            s.next(&events, std::chrono::milliseconds(100));
            for (auto& e : events) {
              if (!e.error.empty()) error = e.error;
              ChoiceResult& c = results[p].at(e.index);
              c.text += e.text;
              c.token_ids.insert(c.token_ids.end(), e.token_ids.begin(), e.token_ids.end());
              c.logprobs.insert(c.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
              c.top_logprobs.insert(c.top_logprobs.end(), e.top_logprobs.begin(), e.top_logprobs.end());
              c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
              if (!e.prompt_logprobs.empty()) c.prompt_logprobs = std::move(e.prompt_logprobs);
              if (e.finish_reason) c.finish_reason = *e.finish_reason;
            }
          }
          usage.prompt_tokens += s.prompt_tokens();
          usage.completion_tokens += s.completion_tokens();
          usage.cached_tokens += s.cached_tokens();
        }
        if (!error.empty()) throw ApiException({500, error, "internal_server_error", "", ""});
        reply_json(res, 200, completion_response(parsed, id, created, model, results, usage));
        return;
      }

      auto request = std::make_shared<ParsedRequest>(std::move(parsed));
      auto first_sent = std::make_shared<std::vector<bool>>(streams->size() * n, false);
      auto n_tokens = std::make_shared<std::vector<int64_t>>(streams->size() * n, 0);  // per choice, so far
      auto parsers = std::make_shared<std::vector<std::unique_ptr<ChatOutputParser>>>();
      for (size_t c = 0; c < streams->size() * n; ++c) parsers->push_back(make_output_parser(*request));
          res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [tracked, streams, request, first_sent, n_tokens, parsers, id, created, model, n](size_t, httplib::DataSink& sink) {
            auto cancel_all = [&] {
              for (auto& s : *streams) s->cancel();
            };
            bool all_done = true;
            for (size_t p = 0; p < streams->size(); ++p) {
              RequestStream& s = *(*streams)[p];
              if (s.done()) continue;
              all_done = false;
              std::vector<GenerateEvent> events;
              s.next(&events, std::chrono::milliseconds(streams->size() == 1 ? 50 : 5));
              for (auto& e : events) {
                const int choice = static_cast<int>(p) * n + e.index;
                if (!e.error.empty()) {
                  sse_write(sink, error_json({500, e.error, "internal_server_error", "", ""}).dump());
                  cancel_all();
                  return false;
                }
                bool first = !(*first_sent)[choice];
                (*first_sent)[choice] = true;
                (*n_tokens)[choice] += static_cast<int64_t>(e.token_ids.size());
                const Usage so_far{s.prompt_tokens(), (*n_tokens)[choice], s.cached_tokens()};
                for (const auto& chunk : stream_chunks(*request, id, created, model, choice, e, first,
                                                       (*parsers)[choice].get(), &so_far)) {
                  if (!sse_write(sink, chunk.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))) {
                    cancel_all();  // the client went away: free its sequences now
                    return false;
                  }
                }
              }
            }
            if (!all_done) {
              // A client that hangs up while its request waits (no token to
              // write yet) is noticed on its socket, not at the next write.
              if (!sink.is_writable() || ConnectionServer::current_client_gone()) {
                cancel_all();
                return false;
              }
              return true;
            }
            if (request->include_usage) {
              Usage usage;
              for (auto& s : *streams) {
                usage.prompt_tokens += s->prompt_tokens();
                usage.completion_tokens += s->completion_tokens();
                usage.cached_tokens += s->cached_tokens();
              }
              sse_write(sink, usage_chunk(*request, id, created, model, usage).dump());
            }
            std::string done = "data: [DONE]\n\n";
            sink.write(done.data(), done.size());
            sink.done();
            return true;
          },
          [tracked](bool) mutable { tracked.reset(); });
    };
  };

  http.Post("/v1/chat/completions", guarded(generate(Endpoint::kChat)));
  http.Post("/v1/completions", guarded(generate(Endpoint::kCompletions)));

  // The agent APIs: translations onto the chat path above (agent_api.h).
  const RouteContext agents{backend_, options_, [this](RequestStream* s) { track(s); },
                            [this](RequestStream* s) { untrack(s); }};
  install_anthropic_routes(http, agents);
  install_responses_routes(http, agents);
}

}  // namespace shardlm::server
