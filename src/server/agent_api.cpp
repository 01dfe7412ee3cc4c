#include "server/agent_api.h"

#include <httplib.h>

#include <algorithm>
#include <random>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/bounded_json.h"
#include "server/connection_server.h"
#include "server/http_server.h"

namespace shardlm::server {

TrackedRequest::TrackedRequest(const RouteContext& ctx, std::unique_ptr<RequestStream> stream)
    : untrack_(ctx.untrack), stream_(std::move(stream)) {
  ctx.track(stream_.get());
}

TrackedRequest::~TrackedRequest() {
  if (!stream_->done()) stream_->cancel();
  untrack_(stream_.get());
}

Usage stream_usage(const RequestStream& s) {
  Usage u;
  u.prompt_tokens = s.prompt_tokens();
  u.completion_tokens = s.completion_tokens();
  u.cached_tokens = s.cached_tokens();
  return u;
}

bool collect_output(RequestStream& s, CollectedOutput* out) {
  std::vector<GenerateEvent> events;
  while (!s.done()) {
    if (ConnectionServer::current_client_gone()) {
      s.cancel();
      return false;
    }
    events.clear();
    s.next(&events, std::chrono::milliseconds(100));
    for (auto& e : events) {
      if (!e.error.empty()) out->error = e.error;
      out->text += e.text;
      if (e.finish_reason) out->finish_reason = *e.finish_reason;
      if (e.stop_string) out->stop_string = e.stop_string;
    }
  }
  out->usage = stream_usage(s);
  return true;
}

ParsedRequest parse_translated_chat(const ordered_json& chat_body, const RouteContext& ctx) {
  // parse_request reads text; the dump is cheap next to rendering and
  // tokenizing, and keeps one validation path for every API.
  return parse_request(Endpoint::kChat, chat_body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                       ctx.backend, ctx.options.limits, ctx.options.api);
}

std::string served_model(const ParsedRequest& parsed, const RouteContext& ctx) {
  const auto& names = ctx.options.served_model_names;
  if (parsed.model.empty()) return names.at(0);
  if (std::find(names.begin(), names.end(), parsed.model) == names.end())
    throw ApiException({404, "The model `" + parsed.model + "` does not exist (this server serves '" + names.at(0) + "').",
                        "not_found_error", "model", "model_not_found"});
  return parsed.model;
}

ordered_json agent_json_body(const httplib::Request& req, const RouteContext& ctx) {
  if (!ctx.backend.ready())
    throw ApiException({503, "the model is still loading; retry shortly", "service_unavailable", "", "model_loading"});
  if (std::string down = ctx.backend.health_error(); !down.empty())
    throw ApiException({503, "the model executor is down: " + down, "service_unavailable", "", "executor_down"});
  std::string type = req.get_header_value("Content-Type");
  std::string media = type.substr(0, type.find(';'));
  media.erase(std::remove_if(media.begin(), media.end(), [](unsigned char c) { return c == ' ' || c == '\t'; }), media.end());
  std::transform(media.begin(), media.end(), media.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (media != "application/json")
    throw ApiException({415, "Content-Type must be application/json, got '" + brief_text(type) + "'", "invalid_request_error", "", ""});
  ordered_json body = parse_bounded_json(req.body, "the request body");
  if (!body.is_object()) throw ApiException({400, "the request body must be a JSON object", "invalid_request_error", "", ""});
  return body;
}

std::string sse_frame(const std::string& event, const ordered_json& data) {
  std::string out;
  if (!event.empty()) out += "event: " + event + "\n";
  out += "data: " + data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
  return out;
}

std::string random_id(const std::string& prefix, int n_hex) {
  thread_local std::mt19937_64 rng(std::random_device{}() ^
                                   static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  static const char* kHex = "0123456789abcdef";
  std::string out = prefix;
  for (int i = 0; i < n_hex; ++i) out.push_back(kHex[rng() & 15]);
  return out;
}

void reply_agent_json(httplib::Response& res, int status, const ordered_json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
}

void agent_guarded(httplib::Response& res, const std::function<void()>& fn,
                   const std::function<ordered_json(const ApiError&)>& shape) {
  auto answer = [&](const ApiError& e) { reply_agent_json(res, e.status, shape(e)); };
  try {
    fn();
  } catch (const ApiException& e) {
    answer(e.error());
  } catch (const Error& e) {
    const int status = e.code() == ErrorCode::kInvalidArgument ? 400 : 500;
    answer({status, e.what(), status == 400 ? "invalid_request_error" : "internal_server_error", "", ""});
  } catch (const nlohmann::json::exception& e) {
    answer({400, "a request field has the wrong type: " + brief_text(e.what(), 200), "invalid_request_error", "", ""});
  } catch (const std::exception& e) {
    answer({500, e.what(), "internal_server_error", "", ""});
  }
}

}  // namespace shardlm::server
