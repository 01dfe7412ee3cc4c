// Hermes-style tool calls (Qwen2.5, Qwen3; vLLM's "hermes"):
//   text <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call> ...
// Content is the text before the first call; text after it is dropped, as
// vLLM does. A block whose JSON has no name is given back as content (if no
// call came before it).
#pragma once

#include <optional>

#include "server/tool_call_json.h"
#include "server/tool_call_parser.h"

namespace shardlm::server {

class HermesToolParser final : public ToolCallParser {
 public:
  explicit HermesToolParser(ToolParserOptions options) : options_(std::move(options)) {}
  ToolParseDelta feed(std::string_view text) override;
  ToolParseDelta finish() override;
  bool called() const override { return n_calls_ > 0; }

 private:
  enum class State { kText, kCall, kClose, kIgnore };
  void give_back(const std::string& text, ToolParseDelta* out);

  ToolParserOptions options_;
  State state_ = State::kText;
  std::string pending_;             // kText / kClose: text not yet decided on
  std::optional<StreamedCall> call_;
  int n_calls_ = 0;
};

}  // namespace shardlm::server
