// Qwen3-Coder XML tool calls (vLLM's "qwen3_coder"):
//   text <tool_call>\n<function=NAME>\n<parameter=P>\nvalue\n</parameter>\n...
//   </function>\n</tool_call>
// Each call becomes JSON arguments {"P": value, ...}: a value is converted by
// the type its tool's schema gives P (string stays a string; integer,
// number, boolean, null, object and array are parsed, and kept as a string
// when they do not parse). One newline after the opening tag and before the
// closing one is the template's layout, not the value's. Streaming: the id
// and name go out once <function=NAME> is complete, then one arguments
// fragment per closed parameter, then the closing brace. Content is the text
// before the first call; a block that does not start with <function=...> is
// given back as content (if no call came before it). A call cut short keeps
// its complete parameters and is closed, so its arguments stay valid JSON.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "server/tool_call_parser.h"

namespace shardlm::server {

class Qwen3CoderToolParser final : public ToolCallParser {
 public:
  explicit Qwen3CoderToolParser(ToolParserOptions options) : options_(std::move(options)) {}
  ToolParseDelta feed(std::string_view text) override;
  ToolParseDelta finish() override;
  bool called() const override { return n_calls_ > 0; }

 private:
  enum class State { kText, kOpen, kBody, kClose, kIgnore };
  // Parses what pending_ holds in state_; false when more text is needed.
  bool step(ToolParseDelta* out);
  void give_back(const std::string& text, ToolParseDelta* out);
  void end_call(ToolParseDelta* out);

  ToolParserOptions options_;
  State state_ = State::kText;
  std::string pending_;   // text not yet decided on
  std::string name_;      // the call's function
  std::string id_;
  bool any_param_ = false;  // the call's arguments have a parameter
  int n_calls_ = 0;
};

// The JSON text of a parameter's raw value under its schema type ("" when
// the schema gives none: kept as a string).
std::string qwen3_coder_value(const std::string& raw, const std::string& type);
// tool name -> parameter -> type, from a chat request's validated `tools`
// (the first type other than "null" of a type list).
std::map<std::string, std::map<std::string, std::string>> tool_parameter_types(const nlohmann::ordered_json& tools);

}  // namespace shardlm::server
