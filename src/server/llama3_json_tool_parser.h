// Llama 3.1/3.2 JSON tool calls (vLLM's "llama3_json"): the output starts
// with <|python_tag|> or directly with the call object,
//   {"name": "f", "parameters": {...}}  (or "arguments"),
// and several calls are separated by ';'. Output that starts otherwise is
// plain content; an object without a name is given back as content.
#pragma once

#include <optional>

#include "server/tool_call_json.h"
#include "server/tool_call_parser.h"

namespace shardlm::server {

class Llama3JsonToolParser final : public ToolCallParser {
 public:
  explicit Llama3JsonToolParser(ToolParserOptions options) : options_(std::move(options)) {}
  ToolParseDelta feed(std::string_view text) override;
  ToolParseDelta finish() override;
  bool called() const override { return n_calls_ > 0; }

 private:
  enum class State { kStart, kContent, kCall, kBetween, kIgnore };
  ToolParserOptions options_;
  State state_ = State::kStart;
  std::string pending_;  // kStart: text not yet decided on
  std::optional<StreamedCall> call_;
  std::string consumed_;  // everything seen while no call was emitted (given back if none is)
  int n_calls_ = 0;
};

}  // namespace shardlm::server
