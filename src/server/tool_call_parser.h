// Tool-call parsers: turn what a model writes into OpenAI tool calls, as one
// whole output (non-streaming) or fed piece by piece (streaming). A streaming
// parser holds back text that might be the start of a tag, so no tag text ever
// leaks into `content`. Each model family's format is its own parser:
//   hermes      <tool_call>{"name": ..., "arguments": {...}}</tool_call>   (Qwen2.5, Qwen3)
//   llama3_json [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]  (Llama 3.1/3.2)
//   qwen3_coder <tool_call><function=f><parameter=p>v</parameter></function></tool_call>  (Qwen3-Coder)
// The names are vLLM's --tool-call-parser names.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm::server {

// A piece of one tool call: a call's first delta carries its id and name
// (and maybe the start of its arguments); later ones only argument text.
struct ToolCallDelta {
  int index = 0;          // which call of the choice, from 0
  std::string id;         // first delta only
  std::string name;       // first delta only
  std::string arguments;  // a fragment of the JSON-string arguments
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as the model wrote it ("{}" if it wrote none)
};

// What may be emitted after some input: content text and tool-call pieces.
struct ToolParseDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
};

struct ToolParserOptions {
  bool parallel_tool_calls = true;               // false: keep the first call only
  std::function<std::string()> make_id;          // unset: "call_" + 24 random hex digits
  // qwen3_coder: tool -> parameter -> JSON schema type, to convert the XML
  // parameter values (absent: strings).
  std::map<std::string, std::map<std::string, std::string>> parameter_types;
  // tool_choice required or named: the grammar writes only call blocks, so
  // no text of the output is content; a block cut short (max_tokens) before
  // its name is dropped, never given back as tag text.
  bool forced = false;
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  // New model text; returns what can be emitted now.
  virtual ToolParseDelta feed(std::string_view text) = 0;
  // The generation ended: releases anything held back.
  virtual ToolParseDelta finish() = 0;
  // At least one call was emitted.
  virtual bool called() const = 0;
};

// The parsers shardlm has, by vLLM's names.
const std::vector<std::string>& tool_call_parser_names();
// Throws Error(kInvalidArgument) naming the known parsers for another name.
std::unique_ptr<ToolCallParser> make_tool_call_parser(const std::string& name, ToolParserOptions options = {});
// The parser a chat template's tool format calls for: "qwen3_coder" when it
// writes <function=...> and <parameter=...>, else "hermes" when it writes <tool_call>, "llama3_json" when it writes <|python_tag|> or
// ipython tool results; "" when it renders no tools.
std::string detect_tool_call_parser(const std::string& chat_template_source);

// Runs `parser` over a whole output: the content and the complete calls.
struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> tool_calls;
};
ParsedToolOutput parse_whole(ToolCallParser& parser, std::string_view text);
// Folds deltas into whole calls (ids and names from first deltas).
void accumulate(const std::vector<ToolCallDelta>& deltas, std::vector<ToolCall>* calls);

// The longest suffix of `text` that is a proper prefix of `tag`: what a
// streaming parser must hold back. Exposed for tests.
size_t partial_tag_suffix(std::string_view text, std::string_view tag);
std::string random_tool_call_id();

}  // namespace shardlm::server
