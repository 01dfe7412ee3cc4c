#include "server/hermes_tool_parser.h"

namespace shardlm::server {

namespace {
constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && std::string_view(s).substr(s.size() - tail.size()) == tail;
}
}  // namespace

void HermesToolParser::give_back(const std::string& text, ToolParseDelta* out) {
  if (n_calls_ == 0 && !options_.forced) out->content += text;
}

ToolParseDelta HermesToolParser::feed(std::string_view text) {
  ToolParseDelta out;
  size_t i = 0;
  while (i < text.size()) {
    switch (state_) {
      case State::kIgnore:
        return out;
      case State::kText: {
        pending_.append(text.substr(i));
        i = text.size();
        size_t at = pending_.find(kOpen);
        if (at != std::string::npos) {
          give_back(pending_.substr(0, at), &out);
          std::string rest = pending_.substr(at + kOpen.size());
          pending_.clear();
          state_ = State::kCall;
          call_.emplace(n_calls_, options_.make_id());
          // Re-enter with the text after the tag.
          ToolParseDelta more = feed(rest);
          out.content += more.content;
          out.tool_calls.insert(out.tool_calls.end(), more.tool_calls.begin(), more.tool_calls.end());
          return out;
        }
        size_t hold = partial_tag_suffix(pending_, kOpen);
        give_back(pending_.substr(0, pending_.size() - hold), &out);
        pending_.erase(0, pending_.size() - hold);
        break;
      }
      case State::kCall: {
        const char c = text[i++];
        call_->push(c, &out.tool_calls);
        const JsonCallScanner& s = call_->scanner();
        const bool closed_early = !s.in_string() && ends_with(call_->raw(), kClose);
        if (!s.done() && !s.failed() && !closed_early) break;
        if (call_->emitted()) {
          // A call (if its JSON broke after the name, it stands as far as it got).
          ++n_calls_;
          call_.reset();
          state_ = !closed_early ? State::kClose : options_.parallel_tool_calls ? State::kText : State::kIgnore;
        } else {
          // No name: the block was text after all.
          give_back(std::string(kOpen) + call_->raw(), &out);
          call_.reset();
          state_ = State::kText;
        }
        break;
      }
      case State::kClose: {
        pending_.append(text.substr(i));
        i = text.size();
        size_t at = pending_.find(kClose);
        if (at != std::string::npos) {
          std::string rest = pending_.substr(at + kClose.size());
          pending_.clear();
          state_ = options_.parallel_tool_calls ? State::kText : State::kIgnore;
          if (state_ == State::kText) {
            ToolParseDelta more = feed(rest);
            out.tool_calls.insert(out.tool_calls.end(), more.tool_calls.begin(), more.tool_calls.end());
          }
          return out;
        }
        // Only the end tag is expected here; keep at most its length.
        if (pending_.size() > kClose.size()) pending_.erase(0, pending_.size() - kClose.size());
        break;
      }
    }
  }
  return out;
}

ToolParseDelta HermesToolParser::finish() {
  ToolParseDelta out;
  if (state_ == State::kText) give_back(pending_, &out);
  if (state_ == State::kCall && call_) {
    if (call_->emitted()) ++n_calls_;  // cut short (length): the call stands as far as it got
    else give_back(std::string(kOpen) + call_->raw(), &out);
  }
  pending_.clear();
  call_.reset();
  state_ = State::kIgnore;
  return out;
}

}  // namespace shardlm::server
