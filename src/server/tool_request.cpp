#include "server/tool_request.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/bounded_json.h"

namespace shardlm::server {

namespace {
[[noreturn]] void bad_request(const std::string& param, const std::string& message) {
  throw ApiException(ApiError{400, message, "invalid_request_error", param, ""});
}
}  // namespace

ordered_json validate_tools(const ordered_json* tools) {
  if (!tools) return ordered_json::array();
  if (!tools->is_array()) bad_request("tools", "'tools' must be a list of {\"type\": \"function\", \"function\": {...}}");
  for (size_t i = 0; i < tools->size(); ++i) {
    const auto& t = (*tools)[i];
    const std::string where = str_cat("tools[", i, "]");
    if (!t.is_object()) bad_request(where, where + " must be an object");
    if (string_field(t, "type") != "function")
      bad_request(where + ".type", str_cat(where, ".type must be \"function\" (the only tool type shardlm supports)"));
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) bad_request(where + ".function", where + ".function must be an object");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || name->get<std::string>().empty())
      bad_request(where + ".function.name", where + ".function.name must be a non-empty string");
    auto params = f->find("parameters");
    if (params != f->end() && !params->is_null() && !params->is_object())
      bad_request(where + ".function.parameters", where + ".function.parameters must be a JSON schema object");
  }
  return *tools;
}

ToolChoice parse_tool_choice(const ordered_json* v, const ordered_json& tools) {
  ToolChoice c;
  c.mode = tools.empty() ? ToolChoice::Mode::kNone : ToolChoice::Mode::kAuto;
  if (!v) return c;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "none") c.mode = ToolChoice::Mode::kNone;
    else if (s == "auto") c.mode = ToolChoice::Mode::kAuto;
    else if (s == "required") c.mode = ToolChoice::Mode::kRequired;
    else bad_request("tool_choice", str_cat("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}; got \"", s, "\""));
  } else if (v->is_object()) {
    auto f = v->find("function");
    if (string_field(*v, "type") != "function" || f == v->end() || !f->is_object() || !f->contains("name") ||
        !(*f)["name"].is_string())
      bad_request("tool_choice", "a named 'tool_choice' must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
    c.mode = ToolChoice::Mode::kNamed;
    c.name = (*f)["name"].get<std::string>();
    bool found = false;
    for (const auto& t : tools) found = found || t["function"]["name"] == c.name;
    if (!found) bad_request("tool_choice", str_cat("'tool_choice' names the function '", c.name, "', which is not in 'tools'"));
  } else {
    bad_request("tool_choice", "'tool_choice' must be a string or an object");
  }
  if (c.mode != ToolChoice::Mode::kNone && tools.empty())
    bad_request("tool_choice", "'tool_choice' other than \"none\" needs 'tools'");
  return c;
}

ordered_json forced_tool_schema(const ordered_json& tools, const ToolChoice& choice, bool parallel) {
  auto params_of = [](const ordered_json& f) {
    auto p = f.find("parameters");
    return p != f.end() && p->is_object() ? *p : ordered_json{{"type", "object"}, {"properties", ordered_json::object()}};
  };
  if (choice.mode == ToolChoice::Mode::kNamed) {
    for (const auto& t : tools)
      if (t["function"]["name"] == choice.name) return params_of(t["function"]);
  }
  if (choice.mode != ToolChoice::Mode::kRequired) return ordered_json();
  ordered_json any_of = ordered_json::array();
  for (const auto& t : tools) {
    const auto& f = t["function"];
    any_of.push_back({{"type", "object"},
                      {"properties", {{"name", {{"type", "string"}, {"enum", {f["name"]}}}}, {"parameters", params_of(f)}}},
                      {"required", {"name", "parameters"}}});
  }
  ordered_json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "object"}, {"anyOf", any_of}}}};
  if (!parallel) schema["maxItems"] = 1;
  return schema;
}

void normalise_tool_fields(ordered_json* m, const std::string& where) {
  auto content = m->find("content");
  if (content == m->end() || content->is_null()) (*m)["content"] = "";
  auto calls = m->find("tool_calls");
  if (calls == m->end() || calls->is_null()) {
    if (calls != m->end()) m->erase("tool_calls");
    return;
  }
  if (!calls->is_array()) bad_request(where + ".tool_calls", where + ".tool_calls must be a list");
  for (size_t j = 0; j < calls->size(); ++j) {
    auto& call = (*calls)[j];
    const std::string w = str_cat(where, ".tool_calls[", j, "]");
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      bad_request(w, w + " must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}");
    auto& f = call["function"];
    if (!f.contains("name") || !f["name"].is_string()) bad_request(w + ".function.name", w + ".function.name must be a string");
    auto args = f.find("arguments");
    if (args != f.end() && args->is_string()) {
      // Bounded like the body: the template and dump() walk the parsed arguments.
      f["arguments"] = parse_bounded_json(args->get<std::string>(), w + ".function.arguments", w + ".function.arguments");
    }
  }
}

}  // namespace shardlm::server
