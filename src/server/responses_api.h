// OpenAI's Responses API (POST /v1/responses, GET and DELETE
// /v1/responses/{id}) over the chat machinery: `instructions` and `input`
// (a string, or message / function_call / function_call_output / reasoning
// items) become chat messages, function tools and tool_choice those of chat
// completions (required / named enforced by the grammar), text.format the
// response_format; the chat output comes back as reasoning, message and
// function_call output items, whole or as the semantic stream events.
// Stored responses (store, default true) live in a bounded in-memory
// ResponseStore; previous_response_id continues one. What is refused and
// why is documented at each field in responses_api.cpp.
#pragma once

#include <memory>
#include <string>

#include "server/agent_api.h"
#include "server/chat_output.h"
#include "server/response_store.h"

namespace shardlm::server {

// A Responses request as chat: `chat` is the chat-completions body; `input`
// the conversation this request adds (chat messages, for the store); `echo`
// the request's fields that the response object repeats.
struct ResponsesTranslation {
  ordered_json chat;
  ordered_json input = ordered_json::array();
  ordered_json echo = ordered_json::object();
  bool store = true;
};

// `previous`: the stored conversation previous_response_id names (null when
// none). Throws ApiException(400, param = the Responses field).
ResponsesTranslation translate_responses_request(const ordered_json& body, const ordered_json* previous);

// Response input items (or output items of an earlier response) as chat
// messages, appended to *messages. `where` names them in errors ("input").
void responses_items_to_messages(const ordered_json& items, const std::string& where, ordered_json* messages);

// The chat output of one response as Responses output items and status.
struct ResponsesOutput {
  ordered_json items = ordered_json::array();
  std::string status = "completed";  // "incomplete": max_output_tokens
};

// The response object (without output and usage when they are null:
// response.created and response.in_progress carry it so).
ordered_json response_object(const std::string& id, int64_t created_at, const std::string& model,
                             const std::string& status, const ordered_json& echo, const ordered_json& output,
                             const ordered_json& usage);

// usage: input_tokens, input_tokens_details.cached_tokens, output_tokens,
// output_tokens_details.reasoning_tokens, total_tokens.
ordered_json responses_usage_json(const Usage& usage, int64_t reasoning_tokens);

// The semantic stream events of one response, in OpenAI's order:
// response.created, response.in_progress; per output item
// response.output_item.added, then for a message response.content_part.added,
// response.output_text.delta..., response.output_text.done,
// response.content_part.done; for a function call
// response.function_call_arguments.delta..., .done; for reasoning
// response.reasoning_text.delta..., .done; response.output_item.done; last
// response.completed (or response.incomplete). Every event carries its
// sequence_number.
class ResponsesStreamEncoder {
 public:
  ResponsesStreamEncoder(const ParsedRequest& request, std::string id, int64_t created_at, std::string model,
                         ordered_json echo);
  std::string start();
  std::string feed(const GenerateEvent& event);
  // After the last event: closes the open item and sends the final event.
  std::string finish(const Usage& usage, int64_t reasoning_tokens);
  // A failed request: response.failed.
  std::string fail(const std::string& message);
  const ordered_json& output() const { return output_; }
  const std::string& status() const { return status_; }
  const std::string& reasoning_text() const { return reasoning_; }
  ordered_json final_response() const { return final_; }

 private:
  enum class Item { kNone, kReasoning, kMessage, kFunctionCall };
  std::string event(const std::string& type, ordered_json body);
  void open(Item kind, ordered_json item, std::string* out);
  void close(std::string* out);
  void add(const ChatDelta& delta, std::string* out);

  std::string id_;
  int64_t created_at_;
  std::string model_;
  ordered_json echo_;
  ChatOutputParser parser_;
  int64_t sequence_ = 0;
  Item item_ = Item::kNone;
  ordered_json current_;           // the open item, accumulated
  int open_call_ = -1;
  ordered_json output_ = ordered_json::array();  // closed items
  std::string reasoning_;          // all reasoning text (for reasoning_tokens)
  std::string finish_reason_ = "length";
  std::string status_ = "in_progress";
  ordered_json final_;
};

// The routes; the store is made from options.responses_store_max_*.
void install_responses_routes(ConnectionServer& http, const RouteContext& ctx);

}  // namespace shardlm::server
