#include "server/request_gate.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <string_view>

#include <nlohmann/json.hpp>

namespace shardlm::server {
namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Our FIN first, then read and drop what the client still sends (at most
// 1 s and 1 MiB), so that it reads our answer instead of a reset.
void drain_and_close(int sock) {
  ::shutdown(sock, SHUT_WR);
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  char scratch[16384];
  size_t drained = 0;
  while (drained < (1u << 20)) {
    pollfd p{sock, POLLIN, 0};
    const int n = ::poll(&p, 1, ms_left(deadline));
    if (n <= 0) break;
    const ssize_t got = ::recv(sock, scratch, sizeof scratch, MSG_DONTWAIT);
    if (got <= 0) break;
    drained += static_cast<size_t>(got);
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

EarlyAnswer error_answer(int status, const std::string& message, const std::string& code) {
  const std::string type = status == 401 ? "authentication_error"
                           : status == 503 ? "service_unavailable"
                                           : "invalid_request_error";
  return {status, openai_error_body(message, type, code), {}};
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// Where the head ends (just past its blank line), or npos.
size_t head_end(const std::string& bytes) {
  const size_t crlf = bytes.find("\r\n\r\n");
  const size_t lf = bytes.find("\n\n");
  if (crlf == std::string::npos && lf == std::string::npos) return std::string::npos;
  if (lf == std::string::npos || (crlf != std::string::npos && crlf < lf)) return crlf + 4;
  return lf + 2;
}

// The framing checks every server needs: a body is either absent or has one
// Content-Length within the limit.
std::optional<EarlyAnswer> check_framing(const RequestHead& head, size_t max_body_bytes) {
  if (head.field("transfer-encoding"))
    return error_answer(411,
                        "chunked request bodies are not accepted (a chunked body cannot be bounded before it is "
                        "read); send the body with a Content-Length header",
                        "length_required");
  std::optional<uint64_t> length;
  for (const auto& [name, value] : head.fields) {
    if (name != "content-length") continue;
    if (value.empty() || value.size() > 19 ||
        !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return error_answer(400, "Content-Length must be a decimal byte count", "invalid_content_length");
    const uint64_t n = std::stoull(value);
    if (length && *length != n) return error_answer(400, "conflicting Content-Length headers", "invalid_content_length");
    length = n;
  }
  if (length && *length > max_body_bytes)
    return error_answer(413,
                        "the request body of " + std::to_string(*length) + " bytes exceeds the limit of " +
                            std::to_string(max_body_bytes) + " bytes (--max-request-body-bytes)",
                        "body_too_large");
  return std::nullopt;
}

}  // namespace

std::optional<std::string> RequestHead::field(const std::string& name) const {
  for (const auto& [n, v] : fields)
    if (n == name) return v;
  return std::nullopt;
}

std::string openai_error_body(const std::string& message, const std::string& type, const std::string& code) {
  nlohmann::json j = {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
  return j.dump();
}

bool secret_equals(const std::string& given, const std::string& want) {
  unsigned char a[EVP_MAX_MD_SIZE], b[EVP_MAX_MD_SIZE];
  unsigned int na = 0, nb = 0;
  EVP_Digest(given.data(), given.size(), a, &na, EVP_sha256(), nullptr);
  EVP_Digest(want.data(), want.size(), b, &nb, EVP_sha256(), nullptr);
  return na == nb && CRYPTO_memcmp(a, b, na) == 0;
}

std::optional<RequestHead> parse_request_head(const std::string& bytes) {
  RequestHead head;
  head.n_bytes = bytes.size();
  std::string_view rest(bytes);
  auto next_line = [&rest]() -> std::optional<std::string_view> {
    const size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) return std::nullopt;
    std::string_view line = rest.substr(0, nl);
    rest.remove_prefix(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    return line;
  };
  auto request_line = next_line();
  if (!request_line) return std::nullopt;
  // method SP target SP HTTP/x.y
  const size_t sp1 = request_line->find(' ');
  const size_t sp2 = request_line->rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return std::nullopt;
  head.method = std::string(request_line->substr(0, sp1));
  head.target = std::string(request_line->substr(sp1 + 1, sp2 - sp1 - 1));
  const std::string_view version = request_line->substr(sp2 + 1);
  if (head.method.empty() || !std::all_of(head.method.begin(), head.method.end(), is_token_char)) return std::nullopt;
  if (head.target.empty() || version.substr(0, 5) != "HTTP/") return std::nullopt;
  head.path = head.target.substr(0, head.target.find('?'));
  head.version = std::string(version);
  for (;;) {
    auto line = next_line();
    if (!line) return std::nullopt;
    if (line->empty()) break;
    const size_t colon = line->find(':');
    if (colon == std::string_view::npos || colon == 0) return std::nullopt;
    const std::string_view name = line->substr(0, colon);
    if (!std::all_of(name.begin(), name.end(), is_token_char)) return std::nullopt;  // also refuses obs-fold
    head.fields.emplace_back(lower(name), std::string(trim(line->substr(colon + 1))));
  }
  return head;
}

std::optional<GateOutcome> judge_head(const std::string& bytes, const GateLimits& limits, const HeadCheck& check) {
  const size_t end = head_end(bytes);
  GateOutcome out;
  out.result = GateResult::kAnswered;
  if (end == std::string::npos || end > limits.max_head_bytes) {
    if (bytes.size() <= limits.max_head_bytes) return std::nullopt;  // wait for more
    out.answer = error_answer(431,
                              "the request line and headers exceed " + std::to_string(limits.max_head_bytes) +
                                  " bytes (--max-header-bytes)",
                              "header_too_large");
    return out;
  }
  auto head = parse_request_head(bytes.substr(0, end));
  if (!head) {
    out.answer = error_answer(400, "malformed HTTP request line or header field", "bad_request");
    return out;
  }
  if (auto refused = check_framing(*head, limits.max_body_bytes)) {
    out.answer = std::move(*refused);
    return out;
  }
  if (check) {
    if (auto refused = check(*head)) {
      out.answer = std::move(*refused);
      return out;
    }
  }
  out.result = GateResult::kPass;
  out.head = std::move(*head);
  return out;
}

EarlyAnswer gate_error(int status, const std::string& message, const std::string& code) {
  return error_answer(status, message, code);
}

void send_answer_and_close(int sock, const EarlyAnswer& answer) {
  std::string bytes = "HTTP/1.1 " + std::to_string(answer.status) + " " + reason_phrase(answer.status) +
                      "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                      std::to_string(answer.body.size()) + "\r\n";
  for (const auto& [name, value] : answer.headers) bytes += name + ": " + value + "\r\n";
  bytes += "\r\n" + answer.body;
  timeval send_timeout{5, 0};  // a client that reads nothing cannot hold the thread
  ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(sock, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  // The refused request's body may still be on its way: drain in any case.
  drain_and_close(sock);
}

void close_connection(int sock) {
  char byte;
  if (::recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) return drain_and_close(sock);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

}  // namespace shardlm::server
