// The HTTP side of `shardlm bench`: one streaming OpenAI request, the model
// list, and a TCP probe that turns "connection refused" into a message that
// says what to do. Uses cpp-httplib's blocking client; one OpenAiClient per
// worker thread (a client is not thread-safe, except cancel()).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loadgen/dataset.h"
#include "loadgen/metrics.h"

namespace httplib {
class Client;
}

namespace shardlm::loadgen {

enum class Endpoint { kChat, kCompletions };

const char* endpoint_path(Endpoint endpoint);  // "/v1/chat/completions" or "/v1/completions"

struct ServerUrl {
  std::string scheme;       // "http" or "https"
  std::string host;
  int port = 0;
  std::string path_prefix;  // e.g. "/api" for http://h/api; a trailing "/v1" is dropped
  std::string origin() const;  // scheme://host:port
  std::string display() const;  // origin + path_prefix, for messages
};

// Throws kInvalidArgument naming --base-url when the URL is malformed.
ServerUrl parse_server_url(const std::string& url);

// TCP connect to the server; throws kIo "cannot connect to http://...:
// connection refused — is the server running?" (or the OS's reason).
void probe_server(const ServerUrl& url, double timeout_s = 5.0);

struct ClientOptions {
  std::string api_key;               // sent as "Authorization: Bearer ..."
  double connect_timeout_s = 10.0;
  double read_timeout_s = 600.0;     // longest silence tolerated mid-response
};

// GET path (e.g. "/metrics"); the body on HTTP 200, else nullopt. Never throws
// for the server's or the network's trouble.
std::optional<std::string> try_get(const ServerUrl& url, const ClientOptions& options, const std::string& path);

// GET /v1/models and return data[0].id; throws with the status/body on failure.
std::string fetch_first_model(const ServerUrl& url, const ClientOptions& options);

struct RequestSpec {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  bool ignore_eos = false;          // vLLM/SGLang/llama.cpp extension
  nlohmann::json extra_body;        // merged into the payload (object or null)
};

// The JSON body for one request (stream + include_usage always on).
nlohmann::json build_payload(const RequestSpec& spec, const SampleRequest& request);

class OpenAiClient {
 public:
  OpenAiClient(const ServerUrl& url, const ClientOptions& options);
  ~OpenAiClient();
  OpenAiClient(const OpenAiClient&) = delete;
  OpenAiClient& operator=(const OpenAiClient&) = delete;

  // Sends one streaming request; never throws for server or network
  // trouble: failures come back as success=false with an error string.
  // `epoch` is the run's time zero for RequestOutput::start_time.
  RequestOutput send(const RequestSpec& spec, const SampleRequest& request,
                     std::chrono::steady_clock::time_point epoch);

  // From any thread: abort the request in flight (Ctrl-C).
  void cancel();

 private:
  ServerUrl url_;
  ClientOptions options_;
  std::unique_ptr<httplib::Client> client_;
  std::atomic<bool> cancelled_{false};
  std::mutex client_mutex_;  // guards client_ against cancel() during construction
};

}  // namespace shardlm::loadgen
