// The request forms that ask for structured output, as one GrammarSpec:
// response_format {"type": "json_object"} / {"type": "json_schema",
// "json_schema": {"name", "schema", "strict"}}, vLLM's structured_outputs
// {json, regex, choice} and its older guided_json / guided_regex /
// guided_choice, and tool_choice "required" / {"type": "function",
// "function": {"name"}} (hermes <tool_call> blocks whose arguments follow
// the tool's parameters schema). Pure JSON: unit-testable without a model.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "grammar/grammar_compiler.h"

namespace shardlm::server {

// nullopt: unconstrained. Throws ApiException (400, naming the parameter)
// for malformed or conflicting forms and for forms shardlm does not
// implement (structured_outputs.grammar, json.whitespace_pattern, ...).
// *param (when given) receives the request parameter that carried it
// ("response_format", "guided_json", "structured_outputs.regex",
// "tool_choice", ...), for the errors of compiling it.
std::optional<grammar::GrammarSpec> parse_structured_output(const nlohmann::ordered_json& body,
                                                            std::string* param = nullptr);

// compiler.compile(spec), stopped when the calling handler's client hangs
// up or after `timeout_s` seconds (> 0; serve's --grammar-compile-timeout),
// with the grammar engine's errors (an unsupported keyword, a malformed
// regex, a budget, the timeout) turned into ApiException(400) naming the
// request parameter that carried the grammar.
std::shared_ptr<const grammar::CompiledGrammar> compile_grammar_or_400(grammar::GrammarCompiler& compiler,
                                                                       const grammar::GrammarSpec& spec,
                                                                       double timeout_s = 0.0);

}  // namespace shardlm::server
