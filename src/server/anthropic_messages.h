// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens)
// over the chat machinery: a request is translated into a chat-completions
// body (system -> a system message, tool_use / tool_result blocks ->
// tool_calls / tool messages, tools' input_schema -> parameters, tool_choice
// any/tool -> required/named, which the grammar enforces), validated by
// parse_request, and the chat output (reasoning, content, tool calls) comes
// back as thinking, text and tool_use blocks, whole or as Anthropic's stream
// events. What is refused and why is documented at each field in
// anthropic_messages.cpp (translate_anthropic_request).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/agent_api.h"
#include "server/chat_output.h"

namespace shardlm::server {

// Paths answered in Anthropic's shapes (their errors too, auth included).
bool is_anthropic_path(const std::string& path);

// {"type": "error", "error": {"type": <Anthropic's type for status>, "message"}}.
ordered_json anthropic_error_json(int status, const std::string& message);

// The chat-completions body a Messages request becomes. count_tokens: the
// request of /v1/messages/count_tokens (no max_tokens; only the prompt
// matters). Throws ApiException(400, param = the Anthropic field).
ordered_json translate_anthropic_request(const ordered_json& body, bool count_tokens);

// "end_turn", "max_tokens", "stop_sequence" or "tool_use", from the chat
// finish reason ("stop", "length", "abort").
std::string anthropic_stop_reason(const std::string& finish_reason, bool tool_called,
                                  const std::optional<std::string>& stop_string);

// usage: input_tokens counts the prompt tokens the prefix cache did not
// serve; those it did are cache_read_input_tokens (Anthropic's split).
ordered_json anthropic_usage_json(const Usage& usage);

// The whole message of a non-streaming answer.
ordered_json anthropic_message_json(const ParsedRequest& request, const std::string& id, const std::string& model,
                                    const CollectedOutput& output);

// Turns a request's generate events into Anthropic's stream events:
// message_start, ping, then per block content_block_start /
// content_block_delta (thinking_delta, text_delta, input_json_delta) /
// content_block_stop, then message_delta (stop_reason, usage) and
// message_stop. Blocks are thinking (reasoning parser), text, tool_use (one
// per call), in the order the model writes them; one is open at a time.
class AnthropicStreamEncoder {
 public:
  AnthropicStreamEncoder(const ParsedRequest& request, std::string id, std::string model);
  std::string start(int64_t n_prompt_tokens);
  std::string feed(const GenerateEvent& event);
  // After the last event: closes the open block; message_delta, message_stop.
  std::string finish(const Usage& usage);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  void open(Block kind, std::string* out, const ordered_json& content_block);
  void close(std::string* out);
  void add(const ChatDelta& delta, std::string* out);

  std::string id_;
  std::string model_;
  ChatOutputParser parser_;
  Block block_ = Block::kNone;
  int n_blocks_ = 0;  // index of the next block
  int open_call_ = -1;  // the tool call whose tool_use block is open
  std::string finish_reason_ = "length";
  std::optional<std::string> stop_string_;
};

// POST /v1/messages (any query, e.g. ?beta=true) and /v1/messages/count_tokens.
void install_anthropic_routes(ConnectionServer& http, const RouteContext& ctx);

}  // namespace shardlm::server
