// N concurrent streaming completions against 127.0.0.1:port from one
// thread (epoll, non-blocking sockets), so that the client costs the same
// whatever server it measures. Time to headers is taken when the response
// head arrived (the server accepted, parsed and submitted the request), time
// to first token when the first SSE chunk carrying text arrives; a stream is complete when it got a 200,
// exactly max_tokens text chunks and `data: [DONE]`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace shardlm::bench {

struct StreamResult {
  bool ok = false;
  double headers_s = -1.0; // connect started -> the response's status line and headers
  double ttft_s = -1.0;    // connect started -> first text chunk
  int64_t n_text_chunks = 0;
  std::string error;       // why it is not ok
};

// Bounded: every stream still open after `timeout` fails with "timeout".
std::vector<StreamResult> run_sse_clients(int port, int n_connections, int64_t max_tokens,
                                          std::chrono::milliseconds timeout);

}  // namespace shardlm::bench
