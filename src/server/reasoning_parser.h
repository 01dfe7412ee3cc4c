// Reasoning parsers (vLLM's --reasoning-parser): split a model's thinking
// from its answer. "qwen3": text between <think> and </think> is reasoning,
// the rest content. Works whole or streamed; a partial tag is held back.
// When the prompt already ends with <think> (templates that open the block
// for the model) the output starts inside the reasoning.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardlm::server {

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // starts_in_reasoning: the rendered prompt ends with the start tag.
  explicit ReasoningParser(bool starts_in_reasoning);
  ReasoningDelta feed(std::string_view text);
  ReasoningDelta finish();

 private:
  enum class State { kStart, kReasoning, kContent };
  State state_;
  std::string pending_;
};

const std::vector<std::string>& reasoning_parser_names();
// Throws Error(kInvalidArgument) for a name shardlm does not have.
void check_reasoning_parser(const std::string& name);
// True when `prompt` ends (after spaces) with the parser's start tag.
bool prompt_opens_reasoning(const std::string& prompt);

}  // namespace shardlm::server
