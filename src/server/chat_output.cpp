#include "server/chat_output.h"

namespace shardlm::server {

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options, ToolParserOptions tool_options) {
  if (!options.reasoning_parser.empty()) {
    check_reasoning_parser(options.reasoning_parser);
    reasoning_.emplace(options.starts_in_reasoning);
  }
  if (!options.tool_call_parser.empty()) {
    tool_options.parallel_tool_calls = options.parallel_tool_calls;
    if (tool_options.parameter_types.empty()) tool_options.parameter_types = options.parameter_types;
    tool_options.forced = options.forced_tool_call;
    tools_ = make_tool_call_parser(options.tool_call_parser, std::move(tool_options));
  }
}

void ChatOutputParser::add_content(std::string_view text, bool finishing, ChatDelta* out) {
  if (!tools_) {
    out->content.append(text);
    return;
  }
  ToolParseDelta d = tools_->feed(text);
  if (finishing) {
    ToolParseDelta last = tools_->finish();
    d.content += last.content;
    d.tool_calls.insert(d.tool_calls.end(), last.tool_calls.begin(), last.tool_calls.end());
  }
  out->content += d.content;
  out->tool_calls.insert(out->tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
}

ChatDelta ChatOutputParser::feed(std::string_view text) {
  ChatDelta out;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->feed(text);
    out.reasoning = std::move(r.reasoning);
    if (!r.content.empty()) add_content(r.content, false, &out);
  } else {
    add_content(text, false, &out);
  }
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out;
  std::string rest;
  if (reasoning_) {
    ReasoningDelta r = reasoning_->finish();
    out.reasoning = std::move(r.reasoning);
    rest = std::move(r.content);
  }
  add_content(rest, true, &out);
  return out;
}

ChatMessage parse_chat_output(const ChatOutputOptions& options, std::string_view text) {
  ChatOutputParser parser(options);
  ChatMessage m;
  for (ChatDelta d : {parser.feed(text), parser.finish()}) {
    m.reasoning += d.reasoning;
    m.content += d.content;
    accumulate(d.tool_calls, &m.tool_calls);
  }
  return m;
}

std::string chat_finish_reason(const std::string& finish_reason, bool tool_called) {
  return tool_called && finish_reason == "stop" ? "tool_calls" : finish_reason;
}

}  // namespace shardlm::server
