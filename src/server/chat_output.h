// What one chat choice's generated text becomes in the response: reasoning
// (--reasoning-parser), content, and tool calls (--tool-call-parser), split
// the same way whether the text arrives whole or streamed.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace shardlm::server {

struct ChatOutputOptions {
  std::string tool_call_parser;      // "" : tool calls are not parsed (no tools, tool_choice none)
  bool parallel_tool_calls = true;
  std::map<std::string, std::map<std::string, std::string>> parameter_types;  // ToolParserOptions' (qwen3_coder)
  std::string reasoning_parser;      // "" : no reasoning split
  bool starts_in_reasoning = false;  // the prompt ends with the reasoning start tag
  bool forced_tool_call = false;     // tool_choice required / named (ToolParserOptions::forced)
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(const ChatOutputOptions& options, ToolParserOptions tool_options = {});
  ChatDelta feed(std::string_view text);
  ChatDelta finish();
  bool tool_called() const { return tools_ && tools_->called(); }

 private:
  void add_content(std::string_view text, bool finishing, ChatDelta* out);
  std::optional<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
};

// The whole message of a non-streaming choice.
struct ChatMessage {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
};
ChatMessage parse_chat_output(const ChatOutputOptions& options, std::string_view text);

// finish_reason "stop" becomes "tool_calls" when the choice called a tool
// ("length" stays: the call may be cut short).
std::string chat_finish_reason(const std::string& finish_reason, bool tool_called);

}  // namespace shardlm::server
