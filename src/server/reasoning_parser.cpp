#include "server/reasoning_parser.h"

#include "core/error.h"
#include "server/tool_call_parser.h"

namespace shardlm::server {

namespace {
constexpr std::string_view kStart = "<think>";
constexpr std::string_view kEnd = "</think>";
bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
}  // namespace

ReasoningParser::ReasoningParser(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningDelta ReasoningParser::feed(std::string_view text) {
  ReasoningDelta out;
  pending_.append(text);
  if (state_ == State::kStart) {
    size_t start = 0;
    while (start < pending_.size() && is_space(pending_[start])) ++start;
    std::string_view head = std::string_view(pending_).substr(start);
    if (head.size() >= kStart.size() && head.substr(0, kStart.size()) == kStart) {
      pending_.erase(0, start + kStart.size());
      state_ = State::kReasoning;
    } else if (head.empty() || kStart.substr(0, head.size()) == head) {
      return out;  // might still become <think>
    } else {
      state_ = State::kContent;
    }
  }
  if (state_ == State::kReasoning) {
    size_t at = pending_.find(kEnd);
    if (at != std::string::npos) {
      out.reasoning = pending_.substr(0, at);
      pending_.erase(0, at + kEnd.size());
      state_ = State::kContent;
    } else {
      size_t hold = partial_tag_suffix(pending_, kEnd);
      out.reasoning = pending_.substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
  }
  out.content += pending_;
  pending_.clear();
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  if (state_ == State::kReasoning) out.reasoning = pending_;
  else out.content = pending_;
  pending_.clear();
  return out;
}

const std::vector<std::string>& reasoning_parser_names() {
  static const std::vector<std::string> names = {"qwen3"};
  return names;
}

void check_reasoning_parser(const std::string& name) {
  if (name != "qwen3")
    fail(ErrorCode::kInvalidArgument, "unknown reasoning parser '", name, "': shardlm has qwen3 (<think>...</think>)");
}

bool prompt_opens_reasoning(const std::string& prompt) {
  size_t end = prompt.size();
  while (end > 0 && is_space(prompt[end - 1])) --end;
  return end >= kStart.size() && std::string_view(prompt).substr(end - kStart.size(), kStart.size()) == kStart;
}

}  // namespace shardlm::server
