#include "server/responses_api.h"

#include <httplib.h>

#include <ctime>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "server/bounded_json.h"
#include "server/connection_server.h"
#include "server/http_server.h"

namespace shardlm::server {

namespace {

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiException(ApiError{400, message, "invalid_request_error", param, ""});
}

[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw ApiException(ApiError{400, message, "invalid_request_error", param, "unsupported_parameter"});
}

const ordered_json* find(const ordered_json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// The text of a message's content: a string, or input_text / output_text
// parts (text parts of earlier outputs come back as input).
std::string content_text(const ordered_json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, where + " must be a string or a list of content parts");
  std::string out;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string w = str_cat(where, "[", j, "]");
    const auto& p = content[j];
    if (!p.is_object()) bad(w, w + " must be a content part object");
    const std::string type = string_field(p, "type");
    if (type == "input_text" || type == "output_text" || type == "text" || type == "refusal") {
      const char* key = type == "refusal" ? "refusal" : "text";
      if (!p.contains(key) || !p[key].is_string()) bad(w + "." + key, str_cat(w, ".", key, " must be a string"));
      if (!out.empty()) out += "\n";
      out += p[key].get<std::string>();
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      refuse(w + ".type", str_cat(w, ": '", type, "' parts are not supported: shardlm serves text-only models"));
    } else {
      bad(w + ".type", str_cat(w, ".type must be input_text or output_text, got '", brief_text(type), "'"));
    }
  }
  return out;
}

// The reasoning text of a reasoning item: its reasoning_text content, else
// its summary. encrypted_content is OpenAI's own and means nothing here.
std::string reasoning_text(const ordered_json& item) {
  std::string out;
  for (const char* key : {"content", "summary"}) {
    const ordered_json* parts = find(item, key);
    if (!parts || !parts->is_array()) continue;
    for (const auto& p : *parts)
      if (p.is_object() && p.contains("text") && p["text"].is_string()) out += p["text"].get<std::string>();
    if (!out.empty()) break;
  }
  return out;
}

// Function tools (and namespaces of them) -> chat tools. A web_search tool
// is left out of what the model is offered: Codex sends one by default, and
// an agent must not fail on its defaults; a tool_choice that forces it is
// refused. Other built-in tools (file_search, code_interpreter, computer use,
// MCP, image generation, local shell, custom/freeform) are refused: shardlm
// runs no tools and its grammar writes JSON arguments only.
void translate_tools(const ordered_json& tools, const std::string& where, ordered_json* out) {
  if (!tools.is_array()) bad(where, "'" + where + "' must be a list of tool definitions");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = str_cat(where, "[", i, "]");
    const auto& t = tools[i];
    if (!t.is_object()) bad(w, w + " must be an object");
    const std::string type = string_field(t, "type");
    // A namespace (Codex 0.171 groups its sub-agent tools in one) is its
    // function tools, offered under their own names.
    if (type == "namespace") {
      const ordered_json* inner = find(t, "tools");
      if (!inner) bad(w + ".tools", w + ".tools must be a list of function tools");
      translate_tools(*inner, w + ".tools", out);
      continue;
    }
    if (type == "web_search" || type == "web_search_preview") continue;  // offered no search: not in the prompt
    if (type != "function")
      refuse(w + ".type", str_cat(w, ".type '", brief_text(type), "' is a built-in tool, which shardlm does not run; only "
                                     "function tools are supported"));
    const std::string name = string_field(t, "name");
    if (name.empty()) bad(w + ".name", w + ".name must be a non-empty string");
    ordered_json f = {{"name", name}};
    if (const ordered_json* d = find(t, "description")) {
      if (!d->is_string()) bad(w + ".description", w + ".description must be a string");
      f["description"] = *d;
    }
    if (const ordered_json* p = find(t, "parameters")) {
      if (!p->is_object()) bad(w + ".parameters", w + ".parameters must be a JSON schema object");
      f["parameters"] = *p;
    }
    // strict is a hint: arguments follow the schema when tool_choice forces the call.
    out->push_back({{"type", "function"}, {"function", f}});
  }
}

ordered_json translate_tool_choice(const ordered_json& tc) {
  if (tc.is_string()) {
    if (tc == "auto" || tc == "none" || tc == "required") return tc;
    bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}");
  }
  if (!tc.is_object()) bad("tool_choice", "'tool_choice' must be a string or an object");
  const std::string type = string_field(tc, "type");
  if (type != "function")
    refuse("tool_choice.type", str_cat("tool_choice of type '", brief_text(type), "' is not supported (function is)"));
  const std::string name = string_field(tc, "name");
  if (name.empty()) bad("tool_choice.name", "a function tool_choice needs the function's 'name'");
  return {{"type", "function"}, {"function", {{"name", name}}}};
}

// text.format -> response_format (the grammar engine enforces json_schema).
void translate_text(const ordered_json& text, ordered_json* chat) {
  if (!text.is_object()) bad("text", "'text' must be an object");
  for (auto it = text.begin(); it != text.end(); ++it) {
    if (it.key() == "verbosity") continue;  // a hint: the model's length is its own (and max_output_tokens')
    if (it.key() != "format") bad("text." + it.key(), str_cat("text.", it.key(), " is not a field of text"));
    const ordered_json& f = it.value();
    if (f.is_null()) continue;
    if (!f.is_object()) bad("text.format", "text.format must be an object");
    const std::string type = string_field(f, "type");
    if (type == "text") continue;
    if (type == "json_object") {
      (*chat)["response_format"] = {{"type", "json_object"}};
    } else if (type == "json_schema") {
      if (!f.contains("schema") || !f["schema"].is_object()) bad("text.format.schema", "text.format.schema must be a JSON schema object");
      ordered_json js = {{"name", f.contains("name") && f["name"].is_string() ? f["name"] : ordered_json("output")},
                         {"schema", f["schema"]}};
      if (f.contains("strict") && f["strict"].is_boolean()) js["strict"] = f["strict"];
      (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", js}};
    } else {
      bad("text.format.type", "text.format.type must be text, json_object or json_schema, got '" + brief_text(type) + "'");
    }
  }
}

const std::set<std::string>& response_fields() {
  static const std::set<std::string> f = {
      "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "max_output_tokens",
      "temperature", "top_p", "stream", "store", "previous_response_id", "metadata", "user", "safety_identifier",
      "prompt_cache_key", "prompt_cache_retention", "client_metadata", "include", "reasoning", "service_tier",
      "truncation", "stream_options", "top_logprobs", "max_tool_calls", "background", "conversation", "prompt"};
  return f;
}

// Fields accepted only at their default, each with why another value is refused.
void check_defaults(const ordered_json& body) {
  auto set = [&](const char* k) { return find(body, k) != nullptr; };
  if (set("background") && body["background"] != false)
    refuse("background", "'background': true is not supported: responses are generated while the request is open");
  if (set("conversation")) refuse("conversation", "'conversation' is not supported; continue with previous_response_id");
  if (set("prompt")) refuse("prompt", "prompt templates ('prompt') are not supported; send 'instructions' and 'input'");
  if (set("top_logprobs") && body["top_logprobs"] != 0) refuse("top_logprobs", "'top_logprobs' is not supported by /v1/responses");
  if (set("max_tool_calls")) refuse("max_tool_calls", "'max_tool_calls' is not supported (shardlm runs no tools)");
  if (set("truncation") && body["truncation"] != "disabled")
    refuse("truncation", "'truncation' must be \"disabled\": shardlm answers a request that does not fit with a 400");
  if (const ordered_json* inc = find(body, "include")) {
    if (!inc->is_array()) bad("include", "'include' must be a list");
    for (size_t i = 0; i < inc->size(); ++i)
      // reasoning.encrypted_content (Codex) is accepted: reasoning items
      // carry their text in `content` instead, and come back as input.
      if ((*inc)[i] != "reasoning.encrypted_content")
        refuse(str_cat("include[", i, "]"), str_cat("include ", brief_json((*inc)[i]), " is not supported"));
  }
  if (const ordered_json* st = find(body, "service_tier"))
    if (!(st->is_string() && (*st == "auto" || *st == "default")))
      refuse("service_tier", "'service_tier' must be \"auto\" or \"default\": shardlm has one tier");
  for (const char* k : {"metadata", "client_metadata", "reasoning", "stream_options"})
    if (const ordered_json* v = find(body, k))
      if (!v->is_object()) bad(k, str_cat("'", k, "' must be an object"));
}

}  // namespace

void responses_items_to_messages(const ordered_json& items, const std::string& where, ordered_json* messages) {
  if (!items.is_array()) bad(where, where + " must be a string or a list of items");
  std::string reasoning;         // waits for the assistant message it belongs to
  bool assistant_open = false;   // the last message is an assistant turn that more calls may join
  auto assistant = [&]() -> ordered_json& {
    if (!assistant_open) {
      messages->push_back({{"role", "assistant"}, {"content", ""}});
      assistant_open = true;
    }
    ordered_json& m = messages->back();
    if (!reasoning.empty()) {
      m["reasoning_content"] = m.value("reasoning_content", "") + reasoning;
      reasoning.clear();
    }
    return m;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string w = str_cat(where, "[", i, "]");
    const auto& item = items[i];
    if (!item.is_object()) bad(w, w + " must be an object");
    std::string type = string_field(item, "type");
    if (type.empty() && item.contains("role")) type = "message";
    if (type == "message") {
      std::string role = string_field(item, "role");
      const ordered_json* content = find(item, "content");
      if (!content) bad(w + ".content", w + ".content is required");
      std::string text = content_text(*content, w + ".content");
      if (role == "assistant") {
        if (assistant_open && messages->back().contains("tool_calls")) assistant_open = false;  // text after calls: a new turn
        ordered_json& m = assistant();
        m["content"] = m["content"].get<std::string>() + text;
        continue;
      }
      if (role == "developer") role = "system";  // Codex's system prompt; templates know system
      if (role != "user" && role != "system")
        bad(w + ".role", str_cat(w, ".role must be user, assistant, system or developer, got '", brief_text(role), "'"));
      messages->push_back({{"role", role}, {"content", text}});
      assistant_open = false;
    } else if (type == "function_call") {
      const std::string call_id = string_field(item, "call_id"), name = string_field(item, "name");
      if (call_id.empty()) bad(w + ".call_id", w + ".call_id must be a non-empty string");
      if (name.empty()) bad(w + ".name", w + ".name must be a non-empty string");
      const ordered_json* args = find(item, "arguments");
      if (args && !args->is_string()) bad(w + ".arguments", w + ".arguments must be a JSON string");
      ordered_json& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = ordered_json::array();
      // Parsed (bounded) as the chat path parses it, so the template gets an object.
      ordered_json parsed = args && !args->get<std::string>().empty()
                                ? parse_bounded_json(args->get<std::string>(), w + ".arguments", w + ".arguments")
                                : ordered_json::object();
      m["tool_calls"].push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", parsed}}}});
    } else if (type == "function_call_output") {
      const std::string call_id = string_field(item, "call_id");
      if (call_id.empty()) bad(w + ".call_id", w + ".call_id must be a non-empty string");
      const ordered_json* output = find(item, "output");
      if (!output) bad(w + ".output", w + ".output is required");
      messages->push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", content_text(*output, w + ".output")}});
      assistant_open = false;
    } else if (type == "reasoning") {
      reasoning += reasoning_text(item);
    } else if (type == "item_reference") {
      refuse(w + ".type", w + ": item_reference is not supported; send the items, or continue with previous_response_id");
    } else {
      refuse(w + ".type", str_cat(w, ".type '", brief_text(type), "' is not supported: input items may be message, "
                                     "function_call, function_call_output or reasoning"));
    }
  }
}

ResponsesTranslation translate_responses_request(const ordered_json& body, const ordered_json* previous) {
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!response_fields().count(it.key())) refuse(it.key(), str_cat("Unrecognized request argument supplied: '", it.key(), "'"));
  check_defaults(body);
  ResponsesTranslation t;
  ordered_json& chat = t.chat;
  chat = ordered_json::object();
  if (const ordered_json* m = find(body, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    chat["model"] = *m;
  }
  if (previous) t.input = *previous;
  const ordered_json* input = find(body, "input");
  if (!input) bad("input", "'input' is required");
  if (input->is_string()) t.input.push_back({{"role", "user"}, {"content", *input}});
  else responses_items_to_messages(*input, "input", &t.input);

  ordered_json messages = ordered_json::array();
  const ordered_json* instructions = find(body, "instructions");
  if (instructions && !instructions->is_string()) bad("instructions", "'instructions' must be a string");
  if (instructions) messages.push_back({{"role", "system"}, {"content", *instructions}});
  // Leading system turns (instructions, developer messages) become one:
  // many templates take a system prompt only as the first message.
  for (const auto& m : t.input) {
    if (m["role"] == "system" && !messages.empty() && messages.back()["role"] == "system" && messages.size() == 1) {
      messages.back()["content"] = messages.back()["content"].get<std::string>() + "\n\n" + m["content"].get<std::string>();
      continue;
    }
    messages.push_back(m);
  }
  if (messages.empty()) bad("input", "'input' must hold at least one message");
  chat["messages"] = messages;

  ordered_json tools = ordered_json::array();
  if (const ordered_json* tl = find(body, "tools")) translate_tools(*tl, "tools", &tools);
  if (!tools.empty()) chat["tools"] = tools;
  if (const ordered_json* tc = find(body, "tool_choice")) {
    ordered_json choice = translate_tool_choice(*tc);
    if (!tools.empty()) chat["tool_choice"] = choice;
    else if (choice != "none" && choice != "auto") bad("tool_choice", "a tool_choice that forces a call needs 'tools'");
  }
  if (const ordered_json* p = find(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) bad("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    if (!tools.empty()) chat["parallel_tool_calls"] = *p;
  }
  if (const ordered_json* text = find(body, "text")) translate_text(*text, &chat);
  if (const ordered_json* v = find(body, "max_output_tokens")) chat["max_tokens"] = *v;
  for (const char* k : {"temperature", "top_p", "stream"})
    if (const ordered_json* v = find(body, k)) chat[k] = *v;
  if (const ordered_json* s = find(body, "store")) {
    if (!s->is_boolean()) bad("store", "'store' must be true or false");
    t.store = s->get<bool>();
  }
  // reasoning.effort / .summary, prompt_cache_key (prefix caching is
  // automatic), client_metadata, user and safety_identifier are hints.

  auto echo = [&](const char* key, ordered_json fallback) {
    const ordered_json* v = find(body, key);
    t.echo[key] = v ? *v : std::move(fallback);
  };
  echo("instructions", nullptr);
  echo("max_output_tokens", nullptr);
  echo("metadata", ordered_json::object());
  echo("parallel_tool_calls", true);
  echo("previous_response_id", nullptr);
  echo("reasoning", {{"effort", nullptr}, {"summary", nullptr}});
  t.echo["store"] = t.store;
  echo("temperature", 1.0);
  echo("text", {{"format", {{"type", "text"}}}});
  echo("tool_choice", "auto");
  echo("tools", ordered_json::array());
  echo("top_p", 1.0);
  t.echo["truncation"] = "disabled";
  echo("user", nullptr);
  return t;
}

ordered_json responses_usage_json(const Usage& u, int64_t reasoning_tokens) {
  return ordered_json{{"input_tokens", u.prompt_tokens},
                      {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                      {"output_tokens", u.completion_tokens},
                      {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                      {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

ordered_json response_object(const std::string& id, int64_t created_at, const std::string& model,
                             const std::string& status, const ordered_json& echo, const ordered_json& output,
                             const ordered_json& usage) {
  ordered_json r = {{"id", id}, {"object", "response"}, {"created_at", created_at}, {"status", status},
                    {"background", false}, {"error", nullptr}};
  r["incomplete_details"] = status == "incomplete" ? ordered_json{{"reason", "max_output_tokens"}} : ordered_json();
  r["model"] = model;
  r["output"] = output;
  for (auto it = echo.begin(); it != echo.end(); ++it) r[it.key()] = it.value();
  r["usage"] = usage;
  return r;
}

namespace {

ordered_json reasoning_item(const std::string& id, const std::string& text) {
  return {{"id", id}, {"type", "reasoning"}, {"summary", ordered_json::array()},
          {"content", ordered_json::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}
ordered_json text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ordered_json::array()}, {"logprobs", ordered_json::array()}};
}
ordered_json message_item(const std::string& id, const std::string& status, const std::string& text) {
  return {{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", ordered_json::array({text_part(text)})}};
}
ordered_json call_item(const std::string& id, const std::string& status, const ToolCall& c) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"call_id", c.id}, {"name", c.name}, {"arguments", c.arguments}};
}

void lstrip(std::string* s) { s->erase(0, s->find_first_not_of(" \t\r\n")); }

}  // namespace

ResponsesStreamEncoder::ResponsesStreamEncoder(const ParsedRequest& request, std::string id, int64_t created_at,
                                               std::string model, ordered_json echo)
    : id_(std::move(id)), created_at_(created_at), model_(std::move(model)), echo_(std::move(echo)), parser_(request.output) {}

std::string ResponsesStreamEncoder::event(const std::string& type, ordered_json body) {
  ordered_json e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto it = body.begin(); it != body.end(); ++it) e[it.key()] = it.value();
  return sse_frame(type, e);
}

std::string ResponsesStreamEncoder::start() {
  ordered_json r = response_object(id_, created_at_, model_, "in_progress", echo_, ordered_json::array(), nullptr);
  std::string out = event("response.created", {{"response", r}});  // two statements: sequence numbers in order
  out += event("response.in_progress", {{"response", r}});
  return out;
}

void ResponsesStreamEncoder::open(Item kind, ordered_json item, std::string* out) {
  item_ = kind;
  current_ = std::move(item);
  const int index = static_cast<int>(output_.size());
  ordered_json added = current_;
  if (kind == Item::kMessage) added["content"] = ordered_json::array();
  if (kind == Item::kReasoning) added["content"] = ordered_json::array();
  if (kind == Item::kFunctionCall) added["arguments"] = "";
  *out += event("response.output_item.added", {{"output_index", index}, {"item", added}});
  if (kind == Item::kMessage)
    *out += event("response.content_part.added",
                  {{"item_id", current_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", text_part("")}});
  if (kind == Item::kReasoning)
    *out += event("response.content_part.added", {{"item_id", current_["id"]}, {"output_index", index}, {"content_index", 0},
                                                  {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
}

void ResponsesStreamEncoder::close(std::string* out) {
  if (item_ == Item::kNone) return;
  const int index = static_cast<int>(output_.size());
  const ordered_json& item_id = current_["id"];
  if (item_ == Item::kMessage) {
    const std::string text = current_["content"][0]["text"];
    *out += event("response.output_text.done",
                  {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", text}, {"logprobs", ordered_json::array()}});
    *out += event("response.content_part.done",
                  {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", current_["content"][0]}});
  } else if (item_ == Item::kReasoning) {
    *out += event("response.reasoning_text.done",
                  {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"text", current_["content"][0]["text"]}});
    *out += event("response.content_part.done",
                  {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}, {"part", current_["content"][0]}});
  } else {
    *out += event("response.function_call_arguments.done",
                  {{"item_id", item_id}, {"output_index", index}, {"name", current_["name"]}, {"arguments", current_["arguments"]}});
  }
  if (current_.contains("status")) current_["status"] = finish_reason_ == "length" ? "incomplete" : "completed";
  *out += event("response.output_item.done", {{"output_index", index}, {"item", current_}});
  output_.push_back(std::move(current_));
  current_ = ordered_json();
  item_ = Item::kNone;
  open_call_ = -1;
}

void ResponsesStreamEncoder::add(const ChatDelta& d, std::string* out) {
  auto index = [&] { return static_cast<int>(output_.size()); };
  if (!d.reasoning.empty()) {
    if (item_ != Item::kReasoning) {
      close(out);
      open(Item::kReasoning, reasoning_item(random_id("rs_"), ""), out);
    }
    current_["content"][0]["text"] = current_["content"][0]["text"].get<std::string>() + d.reasoning;
    reasoning_ += d.reasoning;
    *out += event("response.reasoning_text.delta",
                  {{"item_id", current_["id"]}, {"output_index", index()}, {"content_index", 0}, {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    std::string text = d.content;
    if (item_ != Item::kMessage) lstrip(&text);  // as the whole response: no message of bare whitespace
    if (!text.empty()) {
      if (item_ != Item::kMessage) {
        close(out);
        open(Item::kMessage, message_item(random_id("msg_"), "in_progress", ""), out);
      }
      current_["content"][0]["text"] = current_["content"][0]["text"].get<std::string>() + text;
      *out += event("response.output_text.delta", {{"item_id", current_["id"]}, {"output_index", index()}, {"content_index", 0},
                                                   {"delta", text}, {"logprobs", ordered_json::array()}});
    }
  }
  for (const auto& t : d.tool_calls) {
    if (item_ != Item::kFunctionCall || t.index != open_call_) {
      close(out);
      open(Item::kFunctionCall, call_item(random_id("fc_"), "in_progress", ToolCall{t.id, t.name, ""}), out);
      open_call_ = t.index;
    }
    if (t.arguments.empty()) continue;
    current_["arguments"] = current_["arguments"].get<std::string>() + t.arguments;
    *out += event("response.function_call_arguments.delta",
                  {{"item_id", current_["id"]}, {"output_index", index()}, {"delta", t.arguments}});
  }
}

std::string ResponsesStreamEncoder::feed(const GenerateEvent& e) {
  std::string out;
  if (e.finish_reason) finish_reason_ = *e.finish_reason;
  add(parser_.feed(e.text), &out);
  if (e.finish_reason) add(parser_.finish(), &out);
  return out;
}

std::string ResponsesStreamEncoder::finish(const Usage& usage, int64_t reasoning_tokens) {
  std::string out;
  close(&out);
  // No text and no call: an empty message, as the whole response has.
  bool answered = false;
  for (const auto& item : output_) answered = answered || item["type"] != "reasoning";
  if (!answered) {
    open(Item::kMessage, message_item(random_id("msg_"), "in_progress", ""), &out);
    close(&out);
  }
  status_ = finish_reason_ == "length" ? "incomplete" : "completed";
  final_ = response_object(id_, created_at_, model_, status_, echo_, output_, responses_usage_json(usage, reasoning_tokens));
  out += event(status_ == "completed" ? "response.completed" : "response.incomplete", {{"response", final_}});
  return out;
}

std::string ResponsesStreamEncoder::fail(const std::string& message) {
  status_ = "failed";
  final_ = response_object(id_, created_at_, model_, "failed", echo_, output_, nullptr);
  final_["error"] = {{"code", "server_error"}, {"message", message}};
  return event("response.failed", {{"response", final_}});
}

namespace {

void reply(httplib::Response& res, int status, const ordered_json& body) { reply_agent_json(res, status, body); }

// Runs a handler, answering what it throws in OpenAI's error shape.
template <typename Fn>
void openai_guarded(httplib::Response& res, Fn&& fn) {
  agent_guarded(res, fn, [](const ApiError& e) { return error_json(e); });
}

ApiError not_found(const std::string& id, const std::string& param) {
  return {404, "Response with id '" + brief_text(id) + "' not found.", "invalid_request_error", param, "not_found"};
}

int64_t count_tokens(const ServingBackend& backend, const std::string& text) {
  return text.empty() ? 0 : static_cast<int64_t>(backend.tokenize(text, false).size());
}

// The conversation through this response, for previous_response_id.
ordered_json history_after(const ordered_json& history, const ordered_json& output) {
  ordered_json h = history;
  responses_items_to_messages(output, "output", &h);
  return h;
}

void handle_create(const httplib::Request& req, httplib::Response& res, const RouteContext& ctx,
                   const std::shared_ptr<ResponseStore>& store) {
  ordered_json body = agent_json_body(req, ctx);
  std::optional<StoredResponse> previous;
  if (const ordered_json* p = find(body, "previous_response_id")) {
    if (!p->is_string()) bad("previous_response_id", "'previous_response_id' must be a string");
    previous = store->get(p->get<std::string>());
    if (!previous) throw ApiException(not_found(p->get<std::string>(), "previous_response_id"));
  }
  ResponsesTranslation t = translate_responses_request(body, previous ? &previous->history : nullptr);
  ParsedRequest parsed = parse_translated_chat(t.chat, ctx);
  const std::string model = served_model(parsed, ctx);
  const std::string id = random_id("resp_", 32);
  const int64_t created_at = static_cast<int64_t>(std::time(nullptr));
  parsed.prompts.at(0).request_id = id;
  auto tracked = std::make_shared<TrackedRequest>(ctx, ctx.backend.submit(parsed.prompts.at(0)));

  if (!parsed.stream) {
    CollectedOutput out;
    if (!collect_output(tracked->stream(), &out)) {
      res.status = 499;  // the client hung up; nobody reads this
      return;
    }
    if (!out.error.empty()) throw ApiException({500, out.error, "internal_server_error", "", ""});
    ChatMessage m = parse_chat_output(parsed.output, out.text);
    const std::string status = out.finish_reason == "length" ? "incomplete" : "completed";
    ordered_json items = ordered_json::array();
    if (!m.reasoning.empty()) items.push_back(reasoning_item(random_id("rs_"), m.reasoning));
    lstrip(&m.content);
    if (!m.content.empty() || m.tool_calls.empty()) items.push_back(message_item(random_id("msg_"), status, m.content));
    for (const auto& c : m.tool_calls) items.push_back(call_item(random_id("fc_"), status, c));
    ordered_json r = response_object(id, created_at, model, status, t.echo, items,
                                     responses_usage_json(out.usage, count_tokens(ctx.backend, m.reasoning)));
    if (t.store) store->put(id, StoredResponse{r, history_after(t.input, items)});
    reply(res, 200, r);
    return;
  }

  auto encoder = std::make_shared<ResponsesStreamEncoder>(parsed, id, created_at, model, t.echo);
  auto started = std::make_shared<bool>(false);
  auto history = std::make_shared<ordered_json>(t.store ? std::move(t.input) : ordered_json());
  const bool keep = t.store;
  const ServingBackend* backend = &ctx.backend;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [tracked, encoder, started, history, keep, store, backend, id](size_t, httplib::DataSink& sink) {
        RequestStream& s = tracked->stream();
        auto write = [&](const std::string& frames) {
          if (frames.empty() || sink.write(frames.data(), frames.size())) return true;
          s.cancel();  // the client went away: free its sequence now
          return false;
        };
        if (!*started) {
          *started = true;
          if (!write(encoder->start())) return false;
        }
        if (!s.done()) {
          std::vector<GenerateEvent> events;
          s.next(&events, std::chrono::milliseconds(50));
          for (const auto& e : events) {
            if (!e.error.empty()) {
              write(encoder->fail(e.error));
              s.cancel();
              sink.done();
              return true;
            }
            if (!write(encoder->feed(e))) return false;
          }
          if (!s.done()) {
            if (!sink.is_writable() || ConnectionServer::current_client_gone()) {
              s.cancel();
              return false;
            }
            return true;
          }
        }
        const std::string last = encoder->finish(stream_usage(s), count_tokens(*backend, encoder->reasoning_text()));
        if (keep) store->put(id, StoredResponse{encoder->final_response(), history_after(*history, encoder->output())});
        write(last);
        sink.done();
        return true;
      },
      [tracked](bool) mutable { tracked.reset(); });
}

}  // namespace

void install_responses_routes(ConnectionServer& http, const RouteContext& ctx) {
  auto store = std::make_shared<ResponseStore>(ctx.options.responses_store_max_count, ctx.options.responses_store_max_bytes);
  http.Post("/v1/responses", [ctx, store](const httplib::Request& req, httplib::Response& res) {
    openai_guarded(res, [&] { handle_create(req, res, ctx, store); });
  });
  http.Get(R"(/v1/responses/([^/]+))", [store](const httplib::Request& req, httplib::Response& res) {
    openai_guarded(res, [&] {
      const std::string id = req.matches[1];
      std::optional<StoredResponse> r = store->get(id);
      if (!r) throw ApiException(not_found(id, ""));
      reply(res, 200, r->response);
    });
  });
  http.Delete(R"(/v1/responses/([^/]+))", [store](const httplib::Request& req, httplib::Response& res) {
    openai_guarded(res, [&] {
      const std::string id = req.matches[1];
      if (!store->erase(id)) throw ApiException(not_found(id, ""));
      reply(res, 200, {{"id", id}, {"object", "response"}, {"deleted", true}});
    });
  });
}

}  // namespace shardlm::server
