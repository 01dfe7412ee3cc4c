// What a request asks to constrain its output to, and the compiler that
// turns it into a CompiledGrammar for one vocabulary (with a cache, so the
// same schema across requests shares its DFA and mask tables).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"

namespace shardlm::grammar {

// One tool a tool-call grammar may call.
struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON schema of the arguments
};

struct GrammarSpec {
  enum class Kind {
    kJsonSchema,  // schema: any JSON value valid against it
    kJsonObject,  // any JSON object
    kRegex,       // text: full match
    kChoice,      // choices: exactly one of them
    kToolCalls,   // tools: hermes <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks
  };
  Kind kind = Kind::kJsonObject;
  nlohmann::ordered_json schema;     // kJsonSchema
  std::string text;                  // kRegex
  std::vector<std::string> choices;  // kChoice
  std::vector<ToolSchema> tools;     // kToolCalls: one of them per call
  bool parallel_tool_calls = true;   // kToolCalls: one or more calls (else exactly one)
  JsonOptions json;                  // layout of JSON parts
  std::string key() const;           // identifies the grammar for the cache
  const char* kind_name() const;
};

// The bytes of one hermes tool call (Qwen2.5/Qwen3 chat templates):
// "<tool_call>\n{\"name\": \"NAME\", \"arguments\": ARGS}\n</tool_call>".
constexpr const char* kToolCallOpen = "<tool_call>\n";
constexpr const char* kToolCallClose = "\n</tool_call>";

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, size_t max_cached = 64);
  // Throws Error(kUnsupported) naming an unsupported keyword or construct,
  // Error(kInvalidArgument) for malformed input.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
  const TokenVocabulary& vocabulary() const { return *vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t max_cached_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const CompiledGrammar>> cache_;
  std::deque<std::string> order_;  // oldest first
};

// The NFA of a spec, without a vocabulary (exposed for tests).
Nfa build_nfa(const GrammarSpec& spec);

}  // namespace shardlm::grammar
