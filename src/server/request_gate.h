// The request gate: what each request on a connection must pass before
// httplib reads a byte of it. cpp-httplib 0.11 (Debian 12) reads a header line of
// any length, a chunked body of any size (CVE-2025-46728) and a body before
// the pre-routing handler refuses it (a 401 read 8 MiB first), and it
// URL-decodes header values (an API key containing "%41" compared as "A").
//
// The gate (server/head_waiter.h waits; judge_head decides) peeks at the
// request head in the kernel's receive buffer (MSG_PEEK, with SO_RCVLOWAT so
// epoll sleeps until more bytes arrive), bounded in bytes and in time,
// parses the request line and the raw header fields, and lets the server
// refuse the request from its head alone:
// 408 (head too slow), 431 (head too large), 411 (chunked body), 413
// (Content-Length over the limit), 401, 503. A refused request's body is
// never read into memory. An accepted head is left in the socket for
// httplib to read as before.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace shardlm::server {

// A request line and its header fields, as the client sent them: names in
// lower case, values with surrounding blanks trimmed, never URL-decoded.
struct RequestHead {
  std::string method;
  std::string target;  // path and query, as sent
  std::string path;    // target up to '?'
  std::string version;  // "HTTP/1.1"
  std::vector<std::pair<std::string, std::string>> fields;
  size_t n_bytes = 0;  // of the head, through the blank line

  // The value of the first field with this (lower-case) name.
  std::optional<std::string> field(const std::string& name) const;
};

// A complete response that the gate sends in place of the request.
struct EarlyAnswer {
  int status = 400;
  std::string body;  // JSON
  std::vector<std::pair<std::string, std::string>> headers;
};

struct GateLimits {
  std::chrono::milliseconds start_timeout{std::chrono::seconds(60)};  // connect -> first byte
  std::chrono::milliseconds head_timeout{std::chrono::seconds(30)};   // first byte -> blank line
  std::chrono::milliseconds keep_alive_timeout{std::chrono::seconds(5)};  // idle between requests: closed silently
  std::chrono::milliseconds io_timeout{std::chrono::seconds(30)};     // any one read or write of a served request
  std::chrono::milliseconds body_timeout{std::chrono::seconds(60)};   // the whole body, however it trickles
  size_t max_head_bytes = 64 * 1024;                                  // request line and fields
  size_t max_body_bytes = 8u << 20;                                   // Content-Length
  size_t max_requests_per_connection = 100;                           // then Connection: close
  // Bodies too large to wait for in the kernel's receive buffer are read by
  // the head waiter into memory before a worker takes the request, up to
  // this many bytes over all connections at once; past it a connection waits
  // (unread, so TCP holds its client back) for the bytes to be freed.
  size_t max_buffered_body_bytes = 64u << 20;
};

// The server's own checks on a head that passed the framing checks: draining,
// authentication. nullopt: let the request through.
using HeadCheck = std::function<std::optional<EarlyAnswer>(const RequestHead&)>;

enum class GateResult {
  kPass,         // `head` is filled; the request is still unread in the socket
  kAnswered,     // the gate sent `answer`; close the connection
  kClientGone,   // closed or failed before a whole head arrived: no one to answer
};

struct GateOutcome {
  GateResult result = GateResult::kClientGone;
  RequestHead head;
  EarlyAnswer answer;
};

// The verdict on the bytes of a request head seen so far (peeked from the
// socket, so a head that passes is still there for httplib to read):
// nullopt while the head is incomplete and within max_head_bytes; else kPass
// with the head, or kAnswered with 400 (malformed), 411, 413, 431, or what
// `check` answers.
std::optional<GateOutcome> judge_head(const std::string& bytes, const GateLimits& limits, const HeadCheck& check);

// An OpenAI-shaped error answer (408s and the like, sent by the gate).
EarlyAnswer gate_error(int status, const std::string& message, const std::string& code);

// Sends `answer` with Connection: close, then closes as close_connection does.
void send_answer_and_close(int sock, const EarlyAnswer& answer);

// Closes a connection whose answer went out. With unread bytes in the
// receive buffer a plain close sends a reset, which can destroy the answer
// before the client reads it: then our FIN goes first, and what the client
// still sends is read and dropped (at most 1 s and 1 MiB).
void close_connection(int sock);

// An OpenAI-shaped error body: {"error": {"message", "type", "param", "code"}}.
std::string openai_error_body(const std::string& message, const std::string& type, const std::string& code);

// Constant time in the bytes compared: SHA-256 digests of both, compared
// with CRYPTO_memcmp, so neither a key's length nor its matching prefix
// leaks through timing.
bool secret_equals(const std::string& given, const std::string& want);

// The request head parser, exposed for tests: nullopt when `bytes` is not a
// well-formed request line and fields ending in a blank line.
std::optional<RequestHead> parse_request_head(const std::string& bytes);

}  // namespace shardlm::server
