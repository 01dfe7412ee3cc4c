#include "server/tool_call_parser.h"

#include <random>

#include "core/error.h"
#include "server/hermes_tool_parser.h"
#include "server/llama3_json_tool_parser.h"
#include "server/qwen3_coder_tool_parser.h"

namespace shardlm::server {

size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  const size_t max = std::min(text.size(), tag.size() - 1);
  for (size_t n = max; n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

std::string random_tool_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

const std::vector<std::string>& tool_call_parser_names() {
  static const std::vector<std::string> names = {"hermes", "llama3_json", "qwen3_coder"};
  return names;
}

std::unique_ptr<ToolCallParser> make_tool_call_parser(const std::string& name, ToolParserOptions options) {
  if (!options.make_id) options.make_id = random_tool_call_id;
  if (name == "hermes") return std::make_unique<HermesToolParser>(std::move(options));
  if (name == "llama3_json") return std::make_unique<Llama3JsonToolParser>(std::move(options));
  if (name == "qwen3_coder") return std::make_unique<Qwen3CoderToolParser>(std::move(options));
  fail(ErrorCode::kInvalidArgument, "unknown tool-call parser '", name,
       "': use hermes (Qwen2.5/Qwen3), llama3_json (Llama 3.1) or qwen3_coder (Qwen3-Coder)");
}

std::string detect_tool_call_parser(const std::string& source) {
  if (source.find("<function=") != std::string::npos && source.find("<parameter=") != std::string::npos)
    return "qwen3_coder";
  if (source.find("<tool_call>") != std::string::npos) return "hermes";
  if (source.find("<|python_tag|>") != std::string::npos || source.find("ipython") != std::string::npos)
    return "llama3_json";
  return "";
}

void accumulate(const std::vector<ToolCallDelta>& deltas, std::vector<ToolCall>* calls) {
  for (const auto& d : deltas) {
    if (d.index >= static_cast<int>(calls->size())) calls->resize(d.index + 1);
    ToolCall& c = (*calls)[d.index];
    if (!d.id.empty()) c.id = d.id;
    if (!d.name.empty()) c.name = d.name;
    c.arguments += d.arguments;
  }
}

ParsedToolOutput parse_whole(ToolCallParser& parser, std::string_view text) {
  ParsedToolOutput out;
  for (ToolParseDelta d : {parser.feed(text), parser.finish()}) {
    out.content += d.content;
    accumulate(d.tool_calls, &out.tool_calls);
  }
  return out;
}

}  // namespace shardlm::server
