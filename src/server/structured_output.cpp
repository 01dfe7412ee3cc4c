#include "server/structured_output.h"

#include <chrono>
#include <string>
#include <vector>

#include "core/error.h"
#include "server/bounded_json.h"
#include "server/connection_server.h"
#include "server/serving_backend.h"

namespace shardlm::server {
namespace {

using json = nlohmann::ordered_json;
using grammar::GrammarSpec;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiException({400, message, "invalid_request_error", param, ""});
}

GrammarSpec schema_spec(const json& schema, const std::string& param) {
  if (!schema.is_object() && !schema.is_boolean()) bad(param, "'" + param + "' must be a JSON schema object");
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kJsonSchema;
  s.schema = schema;
  return s;
}

GrammarSpec json_object_spec() {
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kJsonObject;
  s.json.compact = false;  // any layout, with bounded whitespace
  return s;
}

GrammarSpec regex_spec(const json& v, const std::string& param) {
  if (!v.is_string() || v.get<std::string>().empty()) bad(param, "'" + param + "' must be a non-empty regex string");
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kRegex;
  s.text = v.get<std::string>();
  return s;
}

GrammarSpec choice_spec(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) bad(param, "'" + param + "' must be a non-empty list of strings");
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kChoice;
  for (const auto& c : v) {
    if (!c.is_string() || c.get<std::string>().empty()) bad(param, "'" + param + "' must hold non-empty strings");
    s.choices.push_back(c.get<std::string>());
  }
  return s;
}

std::optional<GrammarSpec> response_format(const json& rf) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string())
    bad("response_format", "'response_format' must be an object with a 'type'");
  const std::string type = rf["type"];
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    // OpenAI's json_object takes no schema; one given here would be ignored, so it is refused.
    for (auto it = rf.begin(); it != rf.end(); ++it)
      if (it.key() != "type" && !it.value().is_null())
        bad("response_format." + it.key(), "response_format of type json_object takes no '" + it.key() +
                                               "'; send {\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}} for a schema");
    return json_object_spec();
  }
  if (type == "json_schema") {
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object())
      bad("response_format.json_schema", "response_format of type json_schema needs a 'json_schema' object");
    const json& js = rf["json_schema"];
    for (auto it = js.begin(); it != js.end(); ++it)
      if (it.key() != "name" && it.key() != "schema" && it.key() != "strict" && it.key() != "description")
        bad("response_format.json_schema." + it.key(), "'" + it.key() + "' is not a field of json_schema");
    if (js.contains("strict") && !js["strict"].is_boolean() && !js["strict"].is_null())
      bad("response_format.json_schema.strict", "'strict' must be a boolean");
    // No schema: any JSON object, as OpenAI does.
    if (!js.contains("schema")) return json_object_spec();
    return schema_spec(js["schema"], "response_format.json_schema.schema");
  }
  bad("response_format.type", "response_format type must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
}

std::optional<GrammarSpec> tool_choice(const json& body) {
  if (!body.contains("tool_choice") || body["tool_choice"].is_null()) return std::nullopt;  // null: absent
  const json& tc = body["tool_choice"];
  if (tc.is_string() && (tc == "none" || tc == "auto")) return std::nullopt;
  const bool required = tc.is_string() && tc == "required";
  std::string named;
  if (!required) {
    if (!tc.is_object() || string_field(tc, "type") != "function" || !tc.contains("function") ||
        !tc["function"].is_object() || !tc["function"].contains("name") || !tc["function"]["name"].is_string())
      bad("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}");
    named = tc["function"]["name"].get<std::string>();
  }
  if (!body.contains("tools") || !body["tools"].is_array() || body["tools"].empty())
    bad("tool_choice", "tool_choice '" + std::string(required ? "required" : named) + "' needs a non-empty 'tools' list");
  GrammarSpec s;
  s.kind = GrammarSpec::Kind::kToolCalls;
  s.parallel_tool_calls = required && (!body.contains("parallel_tool_calls") || body["parallel_tool_calls"].is_null() ||
                                       body["parallel_tool_calls"] == true);
  for (const auto& t : body["tools"]) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string())
      bad("tools", "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": ...}}");
    const json& f = t["function"];
    grammar::ToolSchema ts;
    ts.name = f["name"].get<std::string>();
    if (f.contains("parameters") && !f["parameters"].is_null()) ts.parameters = f["parameters"];
    else ts.parameters = json{{"type", "object"}, {"properties", json::object()}};
    if (required || ts.name == named) s.tools.push_back(std::move(ts));
  }
  if (s.tools.empty()) bad("tool_choice", "tool_choice names the function '" + named + "', which is not in 'tools'");
  return s;
}

}  // namespace

std::optional<GrammarSpec> parse_structured_output(const json& body, std::string* param) {
  std::vector<std::pair<std::string, GrammarSpec>> found;  // (parameter, spec)
  auto add = [&](const std::string& param, std::optional<GrammarSpec> s) {
    if (s) found.emplace_back(param, std::move(*s));
  };
  if (body.contains("response_format") && !body["response_format"].is_null()) add("response_format", response_format(body["response_format"]));
  if (body.contains("structured_outputs") && !body["structured_outputs"].is_null()) {
    const json& so = body["structured_outputs"];
    if (!so.is_object()) bad("structured_outputs", "'structured_outputs' must be an object");
    for (auto it = so.begin(); it != so.end(); ++it) {
      const std::string p = "structured_outputs." + it.key();
      if (it.value().is_null()) continue;
      if (it.key() == "json") {
        const json& v = it.value();
        add(p, v.is_string() ? schema_spec(parse_bounded_json(v.get<std::string>(), "'" + p + "'", p), p) : schema_spec(v, p));
      } else if (it.key() == "regex") {
        add(p, regex_spec(it.value(), p));
      } else if (it.key() == "choice") {
        add(p, choice_spec(it.value(), p));
      } else if (it.key() == "json_object") {
        if (it.value() == true) add(p, json_object_spec());
      } else {
        bad(p, "structured_outputs." + it.key() + " is not supported (json, regex, choice and json_object are)");
      }
    }
  }
  if (body.contains("guided_json") && !body["guided_json"].is_null()) {
    const json& v = body["guided_json"];
    add("guided_json", v.is_string() ? schema_spec(parse_bounded_json(v.get<std::string>(), "'guided_json'", "guided_json"), "guided_json")
                                     : schema_spec(v, "guided_json"));
  }
  if (body.contains("guided_regex") && !body["guided_regex"].is_null())
    add("guided_regex", regex_spec(body["guided_regex"], "guided_regex"));
  if (body.contains("guided_choice") && !body["guided_choice"].is_null())
    add("guided_choice", choice_spec(body["guided_choice"], "guided_choice"));
  for (const char* p : {"guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"})
    if (body.contains(p) && !body[p].is_null()) bad(p, std::string("'") + p + "' is not supported");
  add("tool_choice", tool_choice(body));
  if (found.empty()) return std::nullopt;
  if (found.size() > 1)
    bad(found[1].first, "only one structured output constraint per request: '" + found[0].first + "' and '" +
                            found[1].first + "' were both given");
  if (param) *param = found[0].first;
  return std::move(found[0].second);
}

std::shared_ptr<const grammar::CompiledGrammar> compile_grammar_or_400(grammar::GrammarCompiler& compiler,
                                                                       const grammar::GrammarSpec& spec,
                                                                       double timeout_s) {
  const char* param = spec.kind == GrammarSpec::Kind::kToolCalls ? "tools" : "response_format";
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      timeout_s > 0 ? Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))
                    : Clock::time_point::max();
  bool timed_out = false;
  try {
    // Compilation runs on the HTTP thread of the request: it stops when that
    // client hangs up, or at the deadline (both polled every few ms of work).
    return compiler.compile(spec, [&] {
      if (Clock::now() >= deadline) timed_out = true;
      return timed_out || ConnectionServer::current_client_gone();
    });
  } catch (const Error& e) {
    if (timed_out)
      throw ApiException({400, str_cat("structured output (", spec.kind_name(), "): compiling the grammar took more than ",
                                       timeout_s, " s (serve --grammar-compile-timeout); simplify it"),
                          "invalid_request_error", param, ""});
    throw ApiException({400, std::string("structured output (") + spec.kind_name() + "): " + e.what(),
                        "invalid_request_error", param, ""});
  }
}

std::shared_ptr<const grammar::CompiledGrammar> ServingBackend::compile_grammar(const grammar::GrammarSpec& spec) const {
  throw ApiException({400, std::string("structured output (") + spec.kind_name() + ") is not supported by this backend",
                      "invalid_request_error", "response_format", ""});
}

}  // namespace shardlm::server
