// The tool-calling side of a chat request: `tools`, `tool_choice`,
// `parallel_tool_calls`, and the tool calls and results of earlier turns.
#pragma once

#include <string>

#include "server/serving_backend.h"

namespace shardlm::server {

struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed: the function to call
};

// Validates `tools` (a list of {"type": "function", "function": {"name", ...}});
// null -> an empty list. Throws ApiException(400) naming tools[i].<field>.
ordered_json validate_tools(const ordered_json* tools);

// Validates `tool_choice`: "none" | "auto" | "required" |
// {"type": "function", "function": {"name": NAME}}, NAME one of the tools.
// Default: auto with tools, none without (OpenAI's rule).
ToolChoice parse_tool_choice(const ordered_json* tool_choice, const ordered_json& tools);

// The JSON schema constrained decoding must enforce for tool_choice
// required (an array of {"name", "parameters"} objects, one or more; exactly
// one when !parallel) or named (that function's parameters), as vLLM builds
// it. This is the interface to the grammar engine: until it lands, parse_request answers
// required/named with a 400 (not yet supported).
ordered_json forced_tool_schema(const ordered_json& tools, const ToolChoice& choice, bool parallel);

// A chat message as the template expects it (vLLM's rendering): content null
// -> "", tool_calls[].function.arguments given as a JSON string parsed to an
// object. `where` names the message in errors ("messages[2]").
void normalise_tool_fields(ordered_json* message, const std::string& where);

}  // namespace shardlm::server
