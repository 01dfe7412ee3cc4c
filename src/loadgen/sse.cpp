#include "loadgen/sse.h"

namespace shardlm::loadgen {

void SseParser::feed(std::string_view bytes) {
  pending_.append(bytes);
  size_t start = 0;
  for (;;) {
    size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    std::string_view line(pending_.data() + start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    handle_line(line);
    start = nl + 1;
  }
  pending_.erase(0, start);
}

void SseParser::finish() {
  if (!pending_.empty()) {
    std::string last;
    last.swap(pending_);
    if (!last.empty() && last.back() == '\r') last.pop_back();
    handle_line(last);
  }
  dispatch();
}

void SseParser::handle_line(std::string_view line) {
  if (line.empty()) {
    dispatch();
    return;
  }
  if (line.front() == ':') return;  // comment / keep-alive ping
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;  // event:, id:, retry: carry nothing we measure
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

void SseParser::dispatch() {
  if (!has_data_) return;
  std::string data;
  data.swap(data_);
  has_data_ = false;
  on_event_(data);
}

}  // namespace shardlm::loadgen
