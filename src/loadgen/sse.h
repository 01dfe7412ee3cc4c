// Incremental Server-Sent Events parser. Network chunks may split a line (or
// a UTF-8 sequence) anywhere; feed() buffers the tail and reports each
// complete event's data once its terminating blank line arrives.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace shardlm::loadgen {

class SseParser {
 public:
  // Called with the event's data (multiple `data:` lines joined by '\n').
  using EventFn = std::function<void(std::string_view data)>;

  explicit SseParser(EventFn on_event) : on_event_(std::move(on_event)) {}

  void feed(std::string_view bytes);
  // End of stream: an event whose blank line never came is still delivered
  // (some servers close right after the last `data:` line).
  void finish();

 private:
  void handle_line(std::string_view line);
  void dispatch();

  EventFn on_event_;
  std::string pending_;  // bytes after the last '\n'
  std::string data_;     // data lines of the event being built
  bool has_data_ = false;
};

}  // namespace shardlm::loadgen
