// What a request asks to constrain its output to, and the compiler that
// turns it into a CompiledGrammar for one vocabulary (with a cache, so the
// same schema across requests shares its DFA and mask tables).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
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

struct GrammarCompilerOptions {
  // Compiled grammars kept for reuse, least recently used evicted first, by
  // the bytes they hold now (their tables grow while they are used): one
  // large grammar held 150 MiB, and a count bound let six take 899 MiB.
  size_t max_cache_bytes = size_t(256) << 20;
  size_t max_cached = 64;                              // and at most this many
  size_t max_table_bytes = kMaxGrammarTableBytes;      // per grammar (compiled_grammar.h)
  // CompiledGrammar::warm_up at compile: ^(.{1,50}){30,80}$ passes the
  // default table budget after ~290 bytes (1.6 s), and is refused then.
  size_t probe_bytes = 512;
};

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, GrammarCompilerOptions options = {});
  // Throws Error(kUnsupported) naming an unsupported keyword or construct or
  // a budget (NFA states, table bytes), Error(kInvalidArgument) for malformed
  // input or when `cancelled` (polled while the NFA is built and warmed up,
  // every few ms of work) returns true.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec, const std::function<bool()>& cancelled = {});
  const TokenVocabulary& vocabulary() const { return *vocab_; }
  // The cache now: grammars and the bytes they hold.
  size_t n_cached() const;
  size_t cached_bytes() const;

 private:
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator use;  // its key in lru_
  };
  std::shared_ptr<const TokenVocabulary> vocab_;
  GrammarCompilerOptions options_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> cache_;
  std::list<std::string> lru_;  // least recently used first
};

// The NFA of a spec, without a vocabulary (exposed for tests). `cancelled`
// is polled every 65,536 states.
Nfa build_nfa(const GrammarSpec& spec, const std::function<bool()>& cancelled = {});

}  // namespace shardlm::grammar
