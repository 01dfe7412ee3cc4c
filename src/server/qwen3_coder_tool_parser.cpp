#include "server/qwen3_coder_tool_parser.h"

namespace shardlm::server {

namespace {
constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=";
constexpr std::string_view kParameterEnd = "</parameter>";

bool space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

size_t skip_space(const std::string& s, size_t at) {
  while (at < s.size() && space(s[at])) ++at;
  return at;
}

// s from `at` is a proper prefix of tag (more text may complete it).
bool prefix_of(const std::string& s, size_t at, std::string_view tag) {
  const std::string_view rest = std::string_view(s).substr(at);
  return rest.size() < tag.size() && tag.substr(0, rest.size()) == rest;
}

bool starts_with(const std::string& s, size_t at, std::string_view tag) {
  return std::string_view(s).substr(at, tag.size()) == tag;
}
}  // namespace

std::string qwen3_coder_value(const std::string& raw, const std::string& type) {
  using json = nlohmann::ordered_json;
  const json as_string = raw;
  if (type.empty() || type == "string") return as_string.dump();
  if (raw == "null") return "null";
  if (type == "boolean") {
    if (raw == "true" || raw == "True") return "true";
    if (raw == "false" || raw == "False") return "false";
    return as_string.dump();
  }
  const json v = json::parse(raw, nullptr, false);
  if (v.is_discarded()) return as_string.dump();
  const bool fits = (type == "integer" && v.is_number_integer()) || (type == "number" && v.is_number()) ||
                    (type == "object" && v.is_object()) || (type == "array" && v.is_array());
  return fits ? v.dump() : as_string.dump();
}

std::map<std::string, std::map<std::string, std::string>> tool_parameter_types(const nlohmann::ordered_json& tools) {
  std::map<std::string, std::map<std::string, std::string>> out;
  if (!tools.is_array()) return out;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string()) continue;
    auto& params = out[f["name"].get<std::string>()];
    if (!f.contains("parameters") || !f["parameters"].is_object()) continue;
    const auto& schema = f["parameters"];
    if (!schema.contains("properties") || !schema["properties"].is_object()) continue;
    for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
      if (!it.value().is_object() || !it.value().contains("type")) continue;
      const auto& type = it.value()["type"];
      if (type.is_string()) {
        params[it.key()] = type.get<std::string>();
      } else if (type.is_array()) {
        for (const auto& x : type)
          if (x.is_string() && x != "null") {
            params[it.key()] = x.get<std::string>();
            break;
          }
      }
    }
  }
  return out;
}

void Qwen3CoderToolParser::give_back(const std::string& text, ToolParseDelta* out) {
  if (n_calls_ == 0) out->content += text;
}

void Qwen3CoderToolParser::end_call(ToolParseDelta* out) {
  out->tool_calls.push_back({n_calls_, "", "", any_param_ ? "}" : "{}"});
  ++n_calls_;
  any_param_ = false;
}

bool Qwen3CoderToolParser::step(ToolParseDelta* out) {
  switch (state_) {
    case State::kIgnore:
      pending_.clear();
      return false;
    case State::kText: {
      const size_t at = pending_.find(kOpen);
      if (at == std::string::npos) {
        const size_t hold = partial_tag_suffix(pending_, kOpen);
        give_back(pending_.substr(0, pending_.size() - hold), out);
        pending_.erase(0, pending_.size() - hold);
        return false;
      }
      give_back(pending_.substr(0, at), out);
      pending_.erase(0, at + kOpen.size());
      state_ = State::kOpen;
      return true;
    }
    case State::kOpen: {  // after <tool_call>: <function=NAME>
      const size_t at = skip_space(pending_, 0);
      if (at == pending_.size() || prefix_of(pending_, at, kFunction)) return false;
      const size_t end = starts_with(pending_, at, kFunction) ? pending_.find('>', at) : std::string::npos;
      if (end == std::string::npos && starts_with(pending_, at, kFunction) &&
          pending_.find_first_of("<\n", at + kFunction.size()) == std::string::npos)
        return false;  // the name is still coming
      const bool bad_name = end != std::string::npos &&
                            pending_.find_first_of("<\n", at + kFunction.size()) < end;
      if (end == std::string::npos || end == at + kFunction.size() || bad_name) {
        // Not a call after all: the block is text.
        give_back(std::string(kOpen) + pending_, out);
        pending_.clear();
        state_ = State::kText;
        return false;
      }
      name_ = pending_.substr(at + kFunction.size(), end - at - kFunction.size());
      id_ = options_.make_id();
      out->tool_calls.push_back({n_calls_, id_, name_, ""});
      pending_.erase(0, end + 1);
      state_ = State::kBody;
      return true;
    }
    case State::kBody: {  // parameters, then </function>
      const size_t at = skip_space(pending_, 0);
      if (at == pending_.size() || prefix_of(pending_, at, kParameter) || prefix_of(pending_, at, kFunctionEnd) ||
          prefix_of(pending_, at, kClose))
        return false;
      if (starts_with(pending_, at, kFunctionEnd) || starts_with(pending_, at, kClose)) {
        end_call(out);
        pending_.erase(0, at + (starts_with(pending_, at, kClose) ? 0 : kFunctionEnd.size()));
        state_ = State::kClose;
        return true;
      }
      if (!starts_with(pending_, at, kParameter)) {
        // Stray text inside the call: dropped up to the next tag.
        const size_t next = pending_.find('<', at + 1);
        pending_.erase(0, next == std::string::npos ? pending_.size() : next);
        return next != std::string::npos;
      }
      const size_t name_end = pending_.find('>', at);
      if (name_end == std::string::npos) return false;
      // The value ends at </parameter>, or (if the model left it out) at the
      // next parameter or the end of the function.
      const size_t v0 = name_end + 1;
      size_t v1 = std::string::npos, resume = 0;
      for (std::string_view end : {kParameterEnd, kParameter, kFunctionEnd}) {
        const size_t e = pending_.find(end, v0);
        if (e != std::string::npos && e < v1) v1 = e, resume = end == kParameterEnd ? e + end.size() : e;
      }
      if (v1 == std::string::npos) return false;
      const std::string param = pending_.substr(at + kParameter.size(), name_end - at - kParameter.size());
      std::string value = pending_.substr(v0, v1 - v0);
      if (!value.empty() && value.front() == '\n') value.erase(0, 1);
      if (!value.empty() && value.back() == '\n') value.pop_back();
      std::string type;
      if (auto t = options_.parameter_types.find(name_); t != options_.parameter_types.end())
        if (auto p = t->second.find(param); p != t->second.end()) type = p->second;
      out->tool_calls.push_back({n_calls_, "", "",
                                 std::string(any_param_ ? ", " : "{") + nlohmann::ordered_json(param).dump() + ": " +
                                     qwen3_coder_value(value, type)});
      any_param_ = true;
      pending_.erase(0, resume);
      return true;
    }
    case State::kClose: {  // after </function>: </tool_call>
      const size_t at = pending_.find(kClose);
      if (at == std::string::npos) {
        // Only the end tag is expected here; keep at most its length.
        if (pending_.size() > kClose.size()) pending_.erase(0, pending_.size() - kClose.size());
        return false;
      }
      pending_.erase(0, at + kClose.size());
      state_ = options_.parallel_tool_calls ? State::kText : State::kIgnore;
      return true;
    }
  }
  return false;
}

ToolParseDelta Qwen3CoderToolParser::feed(std::string_view text) {
  ToolParseDelta out;
  if (state_ == State::kIgnore) return out;
  pending_.append(text);
  while (step(&out)) {
  }
  return out;
}

ToolParseDelta Qwen3CoderToolParser::finish() {
  ToolParseDelta out;
  if (state_ == State::kText) give_back(pending_, &out);
  if (state_ == State::kOpen) give_back(std::string(kOpen) + pending_, &out);
  if (state_ == State::kBody) end_call(&out);  // cut short: the complete parameters stand
  pending_.clear();
  state_ = State::kIgnore;
  return out;
}

}  // namespace shardlm::server
