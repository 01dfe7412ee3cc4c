#include "loadgen/http_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "loadgen/sse.h"

namespace shardlm::loadgen {

const char* endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::kChat ? "/v1/chat/completions" : "/v1/completions";
}

std::string ServerUrl::origin() const {
  bool v6 = host.find(':') != std::string::npos;
  return str_cat(scheme, "://", v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

std::string ServerUrl::display() const { return origin() + path_prefix; }

ServerUrl parse_server_url(const std::string& url) {
  ServerUrl out;
  auto bad = [&](const char* why) {
    fail(ErrorCode::kInvalidArgument, "--base-url ", url, ": ", why,
         "; expected e.g. http://127.0.0.1:8000");
  };
  size_t sep = url.find("://");
  if (sep == std::string::npos) bad("missing the scheme (http:// or https://)");
  out.scheme = url.substr(0, sep);
  if (out.scheme != "http" && out.scheme != "https") bad("the scheme must be http or https");
  std::string rest = url.substr(sep + 3);
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  if (authority.empty()) bad("no host");
  std::string port_text;
  if (authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string::npos) bad("unterminated [IPv6] host");
    out.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') bad("junk after the [IPv6] host");
      port_text = authority.substr(close + 2);
    }
  } else {
    size_t colon = authority.find(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (out.host.empty()) bad("no host");
  out.port = out.scheme == "https" ? 443 : 80;
  if (!port_text.empty()) {
    if (port_text.find_first_not_of("0123456789") != std::string::npos || port_text.size() > 5)
      bad("the port is not a number");
    out.port = std::stoi(port_text);
    if (out.port < 1 || out.port > 65535) bad("the port is outside 1..65535");
  }
  while (!path.empty() && path.back() == '/') path.pop_back();
  // People paste the OpenAI SDK's base URL (".../v1"); we add /v1 ourselves.
  if (path.size() >= 3 && path.compare(path.size() - 3, 3, "/v1") == 0) path.resize(path.size() - 3);
  out.path_prefix = path;
  return out;
}

void probe_server(const ServerUrl& url, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string port = std::to_string(url.port);
  int rc = getaddrinfo(url.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0)
    fail(ErrorCode::kIo, "cannot connect to ", url.display(), ": cannot resolve host ", url.host,
         " (", gai_strerror(rc), ")");
  int last_errno = 0;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        int n = ::poll(&pfd, 1, static_cast<int>(timeout_s * 1000));
        if (n == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t len = sizeof(err);
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
      }
    }
    ::close(fd);
    if (err == 0) {
      freeaddrinfo(found);
      return;
    }
    last_errno = err;
  }
  freeaddrinfo(found);
  if (last_errno == ECONNREFUSED)
    fail(ErrorCode::kIo, "cannot connect to ", url.display(),
         ": connection refused \xE2\x80\x94 is the server running?");
  std::string reason = std::strerror(last_errno);
  if (!reason.empty()) reason[0] = static_cast<char>(std::tolower(reason[0]));
  fail(ErrorCode::kIo, "cannot connect to ", url.display(), ": ", reason,
       " \xE2\x80\x94 is the server running and reachable?");
}

namespace {

std::unique_ptr<httplib::Client> make_client(const ServerUrl& url, const ClientOptions& options) {
  auto client = std::make_unique<httplib::Client>(url.origin());
  auto to_sec_usec = [](double s, auto&& set) {
    auto sec = static_cast<time_t>(s);
    set(sec, static_cast<time_t>((s - static_cast<double>(sec)) * 1e6));
  };
  to_sec_usec(options.connect_timeout_s, [&](time_t s, time_t us) { client->set_connection_timeout(s, us); });
  to_sec_usec(options.read_timeout_s, [&](time_t s, time_t us) { client->set_read_timeout(s, us); });
  // Small SSE frames and a two-part request write: Nagle plus delayed ACKs
  // would add tens of milliseconds to what we measure.
  client->set_tcp_nodelay(true);
  client->set_keep_alive(true);
  return client;
}

httplib::Headers make_headers(const ClientOptions& options) {
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  return headers;
}

std::string snippet(const std::string& body, size_t max = 300) {
  std::string s = body.substr(0, max);
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  if (body.size() > max) s += "...";
  return s;
}

// A server's {"error": {"message": ...}} or {"error": "..."}; else the raw text.
std::string error_message(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const auto& e = j["error"];
    if (e.is_string()) return e.get<std::string>();
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
  }
  if (!j.is_discarded() && j.is_object() && j.contains("message") && j["message"].is_string())
    return j["message"].get<std::string>();
  return snippet(body);
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::optional<std::string> try_get(const ServerUrl& url, const ClientOptions& options, const std::string& path) {
  auto client = make_client(url, options);
  auto res = client->Get((url.path_prefix + path).c_str(), make_headers(options));
  if (!res || res->status != 200) return std::nullopt;
  return res->body;
}

std::string fetch_first_model(const ServerUrl& url, const ClientOptions& options) {
  auto client = make_client(url, options);
  std::string where = url.display() + "/v1/models";
  auto res = client->Get((url.path_prefix + "/v1/models").c_str(), make_headers(options));
  if (!res)
    fail(ErrorCode::kIo, "GET ", where, " failed: ", httplib::to_string(res.error()),
         "; is this an OpenAI-compatible server? Pass --model NAME to skip the query");
  if (res->status != 200)
    fail(ErrorCode::kIo, "GET ", where, " returned HTTP ", res->status, ": ",
         error_message(res->body), res->status == 401 ? " (pass --api-key)" : "",
         "; pass --model NAME to skip the query");
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array())
    fail(ErrorCode::kIo, "GET ", where, " did not return {\"data\": [...]} (got: ", snippet(res->body),
         "); pass --model NAME");
  if (j["data"].empty() || !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string())
    fail(ErrorCode::kIo, "GET ", where, " lists no model with a string \"id\"; pass --model NAME");
  return j["data"][0]["id"].get<std::string>();
}

nlohmann::json build_payload(const RequestSpec& spec, const SampleRequest& request) {
  nlohmann::json p;
  p["model"] = spec.model;
  if (spec.endpoint == Endpoint::kChat) {
    if (!request.prompt_ids.empty())
      fail(ErrorCode::kInvalidArgument,
           "token-id prompts need --endpoint completions (chat messages are text)");
    p["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt}}});
    // vLLM sends max_completion_tokens; older servers only know max_tokens.
    p["max_completion_tokens"] = request.output_len;
    p["max_tokens"] = request.output_len;
  } else {
    if (!request.prompt_ids.empty())
      p["prompt"] = request.prompt_ids;
    else
      p["prompt"] = request.prompt;
    p["max_tokens"] = request.output_len;
  }
  p["stream"] = true;
  p["stream_options"] = {{"include_usage", true}};
  if (spec.ignore_eos) p["ignore_eos"] = true;
  if (spec.extra_body.is_object())
    for (const auto& [k, v] : spec.extra_body.items()) p[k] = v;
  return p;
}

OpenAiClient::OpenAiClient(const ServerUrl& url, const ClientOptions& options)
    : url_(url), options_(options), client_(make_client(url, options)) {}

OpenAiClient::~OpenAiClient() = default;

void OpenAiClient::cancel() {
  cancelled_ = true;
  std::lock_guard<std::mutex> lock(client_mutex_);
  if (client_) client_->stop();
}

RequestOutput OpenAiClient::send(const RequestSpec& spec, const SampleRequest& request,
                                 std::chrono::steady_clock::time_point epoch) {
  using Clock = std::chrono::steady_clock;
  RequestOutput out;
  out.prompt_len = request.prompt_len;

  httplib::Request req;
  req.method = "POST";
  req.path = url_.path_prefix + endpoint_path(spec.endpoint);
  req.headers = make_headers(options_);
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  req.body = build_payload(spec, request).dump();

  int status = 0;
  std::string error_body;
  std::string stream_error;
  bool first = true;
  Clock::time_point st = Clock::now();
  Clock::time_point last = st;
  bool chat = spec.endpoint == Endpoint::kChat;

  SseParser parser([&](std::string_view data) {
    if (data == "[DONE]" || !stream_error.empty()) return;
    Clock::time_point now = Clock::now();
    auto j = nlohmann::json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      stream_error = "malformed SSE data (not a JSON object): " + snippet(std::string(data), 120);
      return;
    }
    if (j.contains("error")) {
      stream_error = "server error in stream: " + error_message(std::string(data));
      return;
    }
    auto choices = j.find("choices");
    // A chat stream opens with a role-only delta ({"role": "assistant",
    // "content": ""}, as OpenAI and vLLM send it): no token, so neither TTFT
    // nor a chunk.
    auto role_only = [&](const nlohmann::json& c0) {
      if (!chat || !c0.is_object() || !c0.contains("delta") || !c0["delta"].is_object()) return false;
      const auto& d = c0["delta"];
      if (!d.contains("role") || (c0.contains("finish_reason") && !c0["finish_reason"].is_null())) return false;
      for (auto it = d.begin(); it != d.end(); ++it)
        if (it.key() != "role" && !(it.value().is_null() || (it.value().is_string() && it.value().get<std::string>().empty())))
          return false;
      return true;
    };
    if (choices != j.end() && choices->is_array() && !choices->empty() && !role_only((*choices)[0])) {
      if (first) {
        out.ttft = seconds(now - st);
        first = false;
      } else {
        out.itl.push_back(seconds(now - last));
      }
      last = now;
      ++out.n_chunks;
      const auto& c0 = (*choices)[0];
      const nlohmann::json* text = nullptr;
      if (chat && c0.contains("delta") && c0["delta"].is_object() && c0["delta"].contains("content"))
        text = &c0["delta"]["content"];
      else if (!chat && c0.contains("text"))
        text = &c0["text"];
      if (text != nullptr && text->is_string()) out.generated_text += text->get<std::string>();
    }
    // Usage usually rides alone in the last chunk (empty choices); some
    // servers attach it to the final token chunk instead. Take it from either.
    auto usage = j.find("usage");
    if (usage != j.end() && usage->is_object()) {
      if (usage->contains("completion_tokens") && (*usage)["completion_tokens"].is_number_integer()) {
        out.output_tokens = (*usage)["completion_tokens"].get<int64_t>();
        out.usage_reported = true;
      }
      if (usage->contains("prompt_tokens") && (*usage)["prompt_tokens"].is_number_integer())
        out.prompt_len = (*usage)["prompt_tokens"].get<int64_t>();
    }
  });

  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (cancelled_) return false;
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, n);
      return true;
    }
    parser.feed(std::string_view(data, n));
    return true;
  };

  out.start_time = seconds(st - epoch);
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  bool ok = cancelled_ ? false : client_->send(req, res, err);
  if (ok && status == 200) parser.finish();

  if (cancelled_) {
    out.error = "cancelled: the run was interrupted";
    out.cancelled = true;
  } else if (!ok) {
    out.error = str_cat("request to ", url_.display(), req.path, " failed: ", httplib::to_string(err));
    if (err == httplib::Error::Read)
      out.error += str_cat(" (connection closed or no data for ", options_.read_timeout_s, " s)");
  } else if (status != 200) {
    std::string msg = error_message(error_body.empty() ? res.body : error_body);
    out.error = str_cat("HTTP ", status, msg.empty() ? "" : ": ", msg);
  } else if (!stream_error.empty()) {
    out.error = stream_error;
  } else if (first) {
    out.error = "never received a chunk with choices to measure TTFT; the request counts as failed";
  } else {
    out.success = true;
  }
  out.latency = seconds(last - st);
  return out;
}

}  // namespace shardlm::loadgen
