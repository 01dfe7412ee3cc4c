// What the agent APIs (Anthropic Messages, OpenAI Responses) share: they are
// translations onto the chat completions machinery. Each translates its
// request into a chat-completions body and validates it with the same
// parse_request (chat template, tools, tool_choice grammar, reasoning
// parser), submits one backend request, and maps the chat output (reasoning,
// content, tool calls) back to its own shapes.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/openai_protocol.h"
#include <nlohmann/json.hpp>

#include "server/serving_backend.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace shardlm::server {

struct ServerOptions;
class ConnectionServer;

// What HttpServer lends the agent routes: the backend, its options, and the
// request tracking that lets stop() cancel requests in flight.
struct RouteContext {
  ServingBackend& backend;
  const ServerOptions& options;
  std::function<void(RequestStream*)> track;
  std::function<void(RequestStream*)> untrack;
};

// One backend request, tracked by the server while it lives; cancelled when
// dropped unfinished (the handler returned, the client left).
class TrackedRequest {
 public:
  TrackedRequest(const RouteContext& ctx, std::unique_ptr<RequestStream> stream);
  ~TrackedRequest();
  TrackedRequest(const TrackedRequest&) = delete;
  TrackedRequest& operator=(const TrackedRequest&) = delete;
  RequestStream& stream() { return *stream_; }

 private:
  std::function<void(RequestStream*)> untrack_;
  std::unique_ptr<RequestStream> stream_;
};

// The whole output of a non-streaming request.
struct CollectedOutput {
  std::string text;
  std::string finish_reason = "length";
  std::optional<std::string> stop_string;  // the stop sequence that ended it
  std::string error;                       // non-empty: the backend failed it
  Usage usage;
};

// Polls `stream` to the end. Returns false when the client hung up first (the
// request is then cancelled): nothing is written until the answer is whole,
// so the hang-up is seen on the socket.
bool collect_output(RequestStream& stream, CollectedOutput* out);

// The request's chat-completions translation, validated by parse_request
// (Endpoint::kChat) with the server's limits and parsers. ApiException as
// parse_request throws it.
ParsedRequest parse_translated_chat(const ordered_json& chat_body, const RouteContext& ctx);

// parsed.model when it is a served name, the first served name when empty;
// ApiException(404, param "model") otherwise.
std::string served_model(const ParsedRequest& parsed, const RouteContext& ctx);

// The body as JSON (through parse_bounded_json), after the Content-Type and
// readiness checks every generate route makes: 415, 503, 400 as
// ApiException.
ordered_json agent_json_body(const httplib::Request& req, const RouteContext& ctx);

// An SSE frame: "event: <event>\ndata: <json>\n\n" (no event line when empty).
std::string sse_frame(const std::string& event, const ordered_json& data);

// "<prefix><n hex digits>", random.
std::string random_id(const std::string& prefix, int n_hex = 24);

// The usage of a finished stream.
Usage stream_usage(const RequestStream& stream);

// Answers `body` as JSON (invalid UTF-8 replaced).
void reply_agent_json(httplib::Response& res, int status, const ordered_json& body);

// Runs a handler; what it throws is answered with the body `shape` makes of
// it (each API has its own error shape): ApiException as it is, a typed
// Error as 400 (invalid argument) or 500, a JSON type error as 400.
void agent_guarded(httplib::Response& res, const std::function<void()>& fn,
                   const std::function<ordered_json(const ApiError&)>& shape);

}  // namespace shardlm::server
