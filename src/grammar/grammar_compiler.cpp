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

Nfa build_nfa(const GrammarSpec& spec, const std::function<bool()>& cancelled) {
  NfaBuilder b;
  if (cancelled) b.set_cancelled(&cancelled);
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

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, GrammarCompilerOptions options)
    : vocab_(std::move(vocab)), options_(options) {
  SHARDLM_CHECK(vocab_ != nullptr);
}

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec,
                                                                const std::function<bool()>& cancelled) {
  const std::string key = spec.key();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      lru_.splice(lru_.end(), lru_, it->second.use);
      return it->second.grammar;
    }
  }
  auto g = std::make_shared<const CompiledGrammar>(build_nfa(spec, cancelled), vocab_, spec.kind_name(),
                                                   options_.max_table_bytes);
  g->warm_up(options_.probe_bytes, cancelled);
  std::lock_guard<std::mutex> lock(mutex_);
  if (cache_.count(key)) return g;  // another request compiled it meanwhile
  lru_.push_back(key);
  cache_.emplace(key, Entry{g, std::prev(lru_.end())});
  // Evict the least recently used until the rest fit; the newest always stays
  // (the grammars that sequences still use live on with them).
  size_t total = 0;
  for (const auto& [k, e] : cache_) total += e.grammar->memory_bytes();
  while (lru_.size() > 1 && (total > options_.max_cache_bytes || lru_.size() > options_.max_cached)) {
    auto it = cache_.find(lru_.front());
    total -= std::min(total, it->second.grammar->memory_bytes());
    cache_.erase(it);
    lru_.pop_front();
  }
  return g;
}

size_t GrammarCompiler::n_cached() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size();
}

size_t GrammarCompiler::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& [k, e] : cache_) total += e.grammar->memory_bytes();
  return total;
}

}  // namespace shardlm::grammar
