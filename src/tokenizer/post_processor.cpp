#include "tokenizer/post_processor.h"

#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {

namespace {

// Ids of a special token named in a template: from the "special_tokens"
// table when present (it may expand to several ids), else the vocabulary.
std::vector<TokenId> special_ids(const std::string& name, const nlohmann::json& table, const std::string& where,
                                 const PostProcessor::Lookup& lookup) {
  if (table.is_object() && table.contains(name)) {
    const auto& entry = table[name];
    if (!entry.contains("ids") || !entry["ids"].is_array())
      fail(ErrorCode::kCorruptFile, where, ".special_tokens[\"", name, "\"].ids: expected an array of ids");
    return entry["ids"].get<std::vector<TokenId>>();
  }
  auto id = lookup(name);
  if (!id)
    fail(ErrorCode::kCorruptFile, where, ": special token \"", name,
         "\" of the template is neither in special_tokens nor in the vocabulary");
  return {*id};
}

}  // namespace

PostProcessor::PostProcessor(const nlohmann::json& config, const std::string& where, const Lookup& lookup) {
  if (!config.is_null()) add(config, where, lookup);
}

void PostProcessor::add(const nlohmann::json& config, const std::string& where, const Lookup& lookup) {
  if (!config.is_object() || !config.contains("type") || !config["type"].is_string())
    fail(ErrorCode::kCorruptFile, where, ": expected an object with a string \"type\", found ", config.dump());
  std::string type = config["type"];
  if (type == "ByteLevel") return;  // only trims offsets
  if (type == "Sequence") {
    const auto& list = config.value("processors", nlohmann::json());
    if (!list.is_array()) fail(ErrorCode::kCorruptFile, where, ".processors: expected an array");
    for (size_t i = 0; i < list.size(); ++i) add(list[i], str_cat(where, ".processors[", i, "]"), lookup);
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"})
      if (!config.contains(key) || !config[key].is_array() || config[key].size() != 2 || !config[key][1].is_number_integer())
        fail(ErrorCode::kCorruptFile, where, ".", key, ": expected [token, id]");
    prefix_.push_back(config["cls"][1].get<TokenId>());
    suffix_.insert(suffix_.begin(), config["sep"][1].get<TokenId>());
    return;
  }
  if (type != "TemplateProcessing")
    fail(ErrorCode::kUnsupported, where, ": post_processor type \"", type,
         "\" is not supported (supported: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
  const auto& table = config.value("special_tokens", nlohmann::json::object());
  const auto& single = config.value("single", nlohmann::json());
  // Pieces: either {"SpecialToken": {"id": ...}} / {"Sequence": {"id": "A"}},
  // or the string form "[CLS] $A [SEP]" (with optional ":type_id").
  std::vector<std::pair<bool, std::string>> pieces;  // (is_sequence, special token name)
  if (single.is_array()) {
    for (size_t i = 0; i < single.size(); ++i) {
      const auto& p = single[i];
      if (p.contains("Sequence")) {
        pieces.emplace_back(true, "");
      } else if (p.contains("SpecialToken") && p["SpecialToken"].contains("id") && p["SpecialToken"]["id"].is_string()) {
        pieces.emplace_back(false, p["SpecialToken"]["id"].get<std::string>());
      } else {
        fail(ErrorCode::kCorruptFile, where, ".single[", i, "]: expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, found ",
             p.dump());
      }
    }
  } else if (single.is_string()) {
    std::istringstream in(single.get<std::string>());
    std::string word;
    while (in >> word) {
      size_t colon = word.rfind(':');
      std::string name = colon != std::string::npos && colon > 0 ? word.substr(0, colon) : word;
      if (!name.empty() && name[0] == '$') pieces.emplace_back(true, "");
      else pieces.emplace_back(false, name);
    }
  } else {
    fail(ErrorCode::kCorruptFile, where, ".single: expected an array or a string");
  }
  bool seen_sequence = false;
  std::vector<TokenId> prefix, suffix;
  for (const auto& [is_sequence, name] : pieces) {
    if (is_sequence) {
      if (seen_sequence) fail(ErrorCode::kUnsupported, where, ".single: more than one $A sequence");
      seen_sequence = true;
      continue;
    }
    auto ids = special_ids(name, table, where, lookup);
    auto& target = seen_sequence ? suffix : prefix;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  if (!seen_sequence) fail(ErrorCode::kCorruptFile, where, ".single: the template has no $A sequence");
  prefix_.insert(prefix_.end(), prefix.begin(), prefix.end());
  suffix_.insert(suffix_.begin(), suffix.begin(), suffix.end());
}

std::vector<TokenId> PostProcessor::apply(std::vector<TokenId> ids) const {
  if (prefix_.empty() && suffix_.empty()) return ids;
  std::vector<TokenId> out;
  out.reserve(prefix_.size() + ids.size() + suffix_.size());
  out.insert(out.end(), prefix_.begin(), prefix_.end());
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

}  // namespace shardlm
