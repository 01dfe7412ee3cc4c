#include "server/llama3_json_tool_parser.h"

namespace shardlm::server {

namespace {
constexpr std::string_view kPythonTag = "<|python_tag|>";
bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
}  // namespace

ToolParseDelta Llama3JsonToolParser::feed(std::string_view text) {
  ToolParseDelta out;
  size_t i = 0;
  while (i < text.size()) {
    switch (state_) {
      case State::kIgnore:
        return out;
      case State::kContent:
        out.content.append(text.substr(i));
        return out;
      case State::kStart: {
        // Decide from the first non-space text: the tag, '{', or content.
        const char c = text[i++];
        pending_ += c;
        size_t start = 0;
        while (start < pending_.size() && is_space(pending_[start])) ++start;
        std::string_view head = std::string_view(pending_).substr(start);
        if (head.empty()) break;
        if (head.size() >= kPythonTag.size() && head.substr(0, kPythonTag.size()) == kPythonTag) {
          consumed_ = pending_;
          pending_.clear();
          state_ = State::kBetween;  // a call object follows
        } else if (head[0] == '{') {
          consumed_ = pending_.substr(0, pending_.size() - 1);
          pending_.clear();
          state_ = State::kCall;
          call_.emplace(n_calls_, options_.make_id());
          --i;  // the '{' goes to the call
        } else if (kPythonTag.substr(0, head.size()) != head) {
          state_ = State::kContent;
          out.content += pending_;
          pending_.clear();
        }
        break;
      }
      case State::kBetween: {
        // Between calls: spaces and one ';' (after a call), then '{'.
        const char c = text[i];
        if (is_space(c) || (c == ';' && n_calls_ > 0)) {
          if (n_calls_ == 0) consumed_ += c;
          ++i;
        } else if (c == '{' && (options_.parallel_tool_calls || n_calls_ == 0)) {
          state_ = State::kCall;
          call_.emplace(n_calls_, options_.make_id());
        } else {
          // Anything else: after a call it is dropped; before any, the
          // output was not a call.
          if (n_calls_ == 0) {
            out.content += consumed_;
            consumed_.clear();
            state_ = State::kContent;
          } else {
            state_ = State::kIgnore;
          }
        }
        break;
      }
      case State::kCall: {
        call_->push(text[i++], &out.tool_calls);
        const JsonCallScanner& s = call_->scanner();
        if (!s.done() && !s.failed()) break;
        if (call_->emitted()) {
          ++n_calls_;
          consumed_.clear();
          state_ = s.done() ? State::kBetween : State::kIgnore;
        } else {
          // No name: this was JSON content, not a call.
          out.content += consumed_ + call_->raw();
          consumed_.clear();
          state_ = n_calls_ == 0 ? State::kContent : State::kIgnore;
        }
        call_.reset();
        break;
      }
    }
  }
  return out;
}

ToolParseDelta Llama3JsonToolParser::finish() {
  ToolParseDelta out;
  if (state_ == State::kStart) out.content += pending_;
  if (state_ == State::kCall && call_) {
    if (call_->emitted()) ++n_calls_;
    else if (n_calls_ == 0) out.content += consumed_ + call_->raw();
  }
  if (state_ == State::kBetween && n_calls_ == 0) out.content += consumed_;
  pending_.clear();
  call_.reset();
  state_ = State::kIgnore;
  return out;
}

}  // namespace shardlm::server
