#include "grammar/grammar_compiler.h"

#include "core/error.h"
#include "grammar/regex.h"

namespace shardlm::grammar {

const char* GrammarSpec::kind_name() const {
  switch (kind) {
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kJsonObject: return "json_object";
    case Kind::kRegex: return "regex";
    case Kind::kChoice: return "choice";
    case Kind::kToolCalls: return "tool_calls";
  }
  return "";
}

std::string GrammarSpec::key() const {
  std::string k = kind_name();
  k += json.compact ? "|c" : "|w" + std::to_string(json.max_whitespace);
  k += "|d" + std::to_string(json.max_depth) + "|";
  switch (kind) {
    case Kind::kJsonSchema: k += schema.dump(); break;
    case Kind::kJsonObject: break;
    case Kind::kRegex: k += text; break;
    case Kind::kChoice: k += nlohmann::ordered_json(choices).dump(); break;
    case Kind::kToolCalls:
      k += parallel_tool_calls ? "p" : "1";
      for (const auto& t : tools) k += nlohmann::ordered_json::array({t.name, t.parameters}).dump();
      break;
  }
  return k;
}

Nfa build_nfa(const GrammarSpec& spec) {
  NfaBuilder b;
  int32_t start = kEmpty;
  switch (spec.kind) {
    case GrammarSpec::Kind::kJsonSchema: start = json_schema_fragment(b, spec.schema, spec.json, b.accept()); break;
    case GrammarSpec::Kind::kJsonObject: start = json_object_fragment(b, spec.json, b.accept()); break;
    case GrammarSpec::Kind::kRegex: start = compile_regex(b, spec.text, b.accept()); break;
    case GrammarSpec::Kind::kChoice: {
      if (spec.choices.empty()) fail(ErrorCode::kInvalidArgument, "choice: the list of choices is empty");
      std::vector<int32_t> starts;
      for (const auto& c : spec.choices) {
        if (c.empty()) fail(ErrorCode::kInvalidArgument, "choice: a choice is the empty string");
        starts.push_back(b.literal(c, b.accept()));
      }
      start = b.alt(starts);
      break;
    }
    case GrammarSpec::Kind::kToolCalls: {
      if (spec.tools.empty()) fail(ErrorCode::kInvalidArgument, "tool_calls: no tools to call");
      // calls := call ("\n" call)*   (or exactly one call)
      const int32_t loop = spec.parallel_tool_calls ? b.add_state() : b.accept();
      std::vector<int32_t> starts;
      for (const auto& t : spec.tools) {
        const int32_t args = json_schema_fragment(
            b, t.parameters, spec.json, b.literal(std::string("}") + kToolCallClose, loop));
        const std::string head = std::string(kToolCallOpen) + "{\"name\": " + nlohmann::ordered_json(t.name).dump() +
                                 ", \"arguments\": ";
        starts.push_back(b.literal(head, args));
      }
      start = b.alt(starts);
      if (spec.parallel_tool_calls) {
        b.add_eps(loop, b.accept());
        if (start != kEmpty) b.add_eps(loop, b.literal("\n", start));
      }
      break;
    }
  }
  return b.finish(start, spec.kind_name());
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, size_t max_cached)
    : vocab_(std::move(vocab)), max_cached_(max_cached) {
  SHARDLM_CHECK(vocab_ != nullptr);
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  auto g = std::make_shared<const CompiledGrammar>(build_nfa(spec), vocab_, spec.kind_name());
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_.emplace(key, g).second) {
    order_.push_back(key);
    while (order_.size() > max_cached_) {
      cache_.erase(order_.front());
      order_.pop_front();
    }
  }
  return g;
}

}  // namespace shardlm::grammar
