#include "server/anthropic_messages.h"

#include <httplib.h>

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

const ordered_json* find(const ordered_json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

// Text of a `system` or tool_result content: a string or a list of
// {"type": "text", "text"} blocks (cache_control and citations on them are
// hints: prefix caching is automatic, citations are not produced).
std::string text_of(const ordered_json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(where, where + " must be a string or a list of text blocks");
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = str_cat(where, "[", i, "]");
    const auto& b = v[i];
    if (!b.is_object()) bad(w, w + " must be a content block object");
    const std::string type = string_field(b, "type");
    if (type != "text")
      bad(w + ".type", str_cat(w, ".type '", brief_text(type), "' is not supported here: only text blocks are (shardlm serves "
                                  "text-only models)"));
    if (!b.contains("text") || !b["text"].is_string()) bad(w + ".text", w + ".text must be a string");
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

// A user turn: text blocks become the user message; each tool_result
// becomes a tool message (before the text, in block order, as the template
// expects tool answers right after the assistant's calls).
void translate_user(const ordered_json& content, const std::string& where, ordered_json* out) {
  if (content.is_string()) {
    out->push_back({{"role", "user"}, {"content", content}});
    return;
  }
  if (!content.is_array()) bad(where, where + " must be a string or a list of content blocks");
  std::string text;
  auto flush = [&] {
    if (!text.empty()) out->push_back({{"role", "user"}, {"content", text}});
    text.clear();
  };
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string w = str_cat(where, "[", j, "]");
    const auto& b = content[j];
    if (!b.is_object()) bad(w, w + " must be a content block object");
    const std::string type = string_field(b, "type");
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad(w + ".text", w + ".text must be a string");
      if (!text.empty()) text += "\n";
      text += b["text"].get<std::string>();
    } else if (type == "tool_result") {
      flush();
      const std::string id = string_field(b, "tool_use_id");
      if (id.empty()) bad(w + ".tool_use_id", w + ".tool_use_id must be a non-empty string");
      const ordered_json* c = find(b, "content");
      // is_error is accepted: the result's text says what went wrong.
      out->push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", c ? text_of(*c, w + ".content") : ""}});
    } else if (type == "image" || type == "document" || type == "search_result") {
      bad(w + ".type", str_cat(w, ": '", type, "' blocks are not supported: shardlm serves text-only models"));
    } else {
      bad(w + ".type", str_cat(w, ".type must be text or tool_result in a user message, got '", brief_text(type), "'"));
    }
  }
  flush();
}

// An assistant turn: text -> content, thinking -> reasoning_content (the
// name templates read), tool_use -> tool_calls. redacted_thinking is
// dropped: its text is encrypted by Anthropic and means nothing here.
void translate_assistant(const ordered_json& content, const std::string& where, ordered_json* out) {
  ordered_json m = {{"role", "assistant"}, {"content", ""}};
  if (content.is_string()) {
    m["content"] = content;
    out->push_back(std::move(m));
    return;
  }
  if (!content.is_array()) bad(where, where + " must be a string or a list of content blocks");
  std::string text, thinking;
  ordered_json calls = ordered_json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string w = str_cat(where, "[", j, "]");
    const auto& b = content[j];
    if (!b.is_object()) bad(w, w + " must be a content block object");
    const std::string type = string_field(b, "type");
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) bad(w + ".text", w + ".text must be a string");
      text += b["text"].get<std::string>();
    } else if (type == "thinking") {
      thinking += string_field(b, "thinking");
    } else if (type == "redacted_thinking") {
      continue;
    } else if (type == "tool_use") {
      const std::string id = string_field(b, "id"), name = string_field(b, "name");
      if (id.empty()) bad(w + ".id", w + ".id must be a non-empty string");
      if (name.empty()) bad(w + ".name", w + ".name must be a non-empty string");
      const ordered_json* input = find(b, "input");
      if (input && !input->is_object()) bad(w + ".input", w + ".input must be an object");
      calls.push_back({{"id", id}, {"type", "function"},
                       {"function", {{"name", name}, {"arguments", input ? *input : ordered_json::object()}}}});
    } else {
      bad(w + ".type", str_cat(w, ".type must be text, thinking, redacted_thinking or tool_use in an assistant message, got '",
                               brief_text(type), "' (server tools are not supported)"));
    }
  }
  m["content"] = text;
  if (!thinking.empty()) m["reasoning_content"] = thinking;
  if (!calls.empty()) m["tool_calls"] = calls;
  out->push_back(std::move(m));
}

ordered_json translate_tools(const ordered_json& tools) {
  if (!tools.is_array()) bad("tools", "'tools' must be a list of tool definitions");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string w = str_cat("tools[", i, "]");
    const auto& t = tools[i];
    if (!t.is_object()) bad(w, w + " must be an object");
    // Server tools (web_search_*, bash_*, text_editor_*, computer_*,
    // code_execution_*, ...) carry a versioned type: shardlm runs no tools.
    const ordered_json* type = find(t, "type");
    if (type && !(type->is_string() && type->get<std::string>() == "custom"))
      bad(w + ".type", str_cat(w, ".type ", brief_json(*type), " is a server tool, which shardlm does not run; define a custom "
                                  "tool (name, description, input_schema) and run it in the client"));
    const std::string name = string_field(t, "name");
    if (name.empty()) bad(w + ".name", w + ".name must be a non-empty string");
    const ordered_json* schema = find(t, "input_schema");
    if (!schema || !schema->is_object()) bad(w + ".input_schema", w + ".input_schema must be a JSON schema object");
    // cache_control, defer_loading, strict and input_examples are hints: every
    // tool is rendered into the prompt (no tool search), tool_use input
    // follows the schema only when tool_choice forces the call (grammar).
    ordered_json f = {{"name", name}, {"parameters", *schema}};
    if (const ordered_json* d = find(t, "description")) {
      if (!d->is_string()) bad(w + ".description", w + ".description must be a string");
      f["description"] = *d;
    }
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return out;
}

// Anthropic's tool_choice -> OpenAI's, onto `chat`.
void translate_tool_choice(const ordered_json& tc, ordered_json* chat) {
  if (!tc.is_object()) bad("tool_choice", "'tool_choice' must be an object {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}");
  const std::string type = string_field(tc, "type");
  if (type == "auto") (*chat)["tool_choice"] = "auto";
  else if (type == "any") (*chat)["tool_choice"] = "required";
  else if (type == "none") (*chat)["tool_choice"] = "none";
  else if (type == "tool") {
    const std::string name = string_field(tc, "name");
    if (name.empty()) bad("tool_choice.name", "tool_choice of type 'tool' needs the tool's 'name'");
    (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
  } else {
    bad("tool_choice.type", "tool_choice.type must be auto, any, tool or none, got " + brief_json(tc.value("type", ordered_json())));
  }
  if (const ordered_json* d = find(tc, "disable_parallel_tool_use")) {
    if (!d->is_boolean()) bad("tool_choice.disable_parallel_tool_use", "'disable_parallel_tool_use' must be true or false");
    (*chat)["parallel_tool_calls"] = !d->get<bool>();
  }
}

// Structured output: output_config.format / output_format
// {"type": "json_schema", "schema"} through the grammar engine.
void translate_format(const ordered_json& f, const std::string& where, ordered_json* chat) {
  if (!f.is_object() || string_field(f, "type") != "json_schema" || !f.contains("schema") || !f["schema"].is_object())
    bad(where, where + " must be {\"type\": \"json_schema\", \"schema\": {...}}");
  (*chat)["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", f["schema"]}}}};
}

const std::set<std::string>& message_fields() {
  static const std::set<std::string> f = {
      "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
      "metadata", "tools", "tool_choice", "thinking", "service_tier", "context_management", "output_config",
      "output_format"};
  return f;
}

}  // namespace

bool is_anthropic_path(const std::string& path) { return path == "/v1/messages" || path.rfind("/v1/messages/", 0) == 0; }

ordered_json anthropic_error_json(int status, const std::string& message) {
  return ordered_json{{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

ordered_json translate_anthropic_request(const ordered_json& body, bool count_tokens) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    if (message_fields().count(key)) continue;
    if (key == "container" || key == "mcp_servers")
      bad(key, str_cat("'", key, "' is not supported: shardlm runs no server tools"));
    bad(key, str_cat(key, ": Extra inputs are not permitted"));
  }
  ordered_json chat = ordered_json::object();
  if (const ordered_json* m = find(body, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    chat["model"] = *m;
  } else {
    bad("model", "model: Field required");
  }

  ordered_json messages = ordered_json::array();
  if (const ordered_json* s = find(body, "system")) messages.push_back({{"role", "system"}, {"content", text_of(*s, "system")}});
  const ordered_json* msgs = find(body, "messages");
  if (!msgs) bad("messages", "messages: Field required");
  if (!msgs->is_array() || msgs->empty()) bad("messages", "'messages' must be a non-empty list");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const auto& m = (*msgs)[i];
    const std::string w = str_cat("messages[", i, "]");
    if (!m.is_object()) bad(w, w + " must be an object with 'role' and 'content'");
    const std::string role = string_field(m, "role");
    auto content = m.find("content");
    if (content == m.end()) bad(w + ".content", w + ".content: Field required");
    if (role == "user") translate_user(*content, w + ".content", &messages);
    else if (role == "assistant") translate_assistant(*content, w + ".content", &messages);
    // Anthropic's API takes only user and assistant turns, but Claude Code
    // (2.1) sends its environment as a system message after the first user
    // turn, and its retries keep it: a 400 would end the session. It is
    // rendered where it stands, as chat templates render a later system turn.
    else if (role == "system") messages.push_back({{"role", "system"}, {"content", text_of(*content, w + ".content")}});
    else bad(w + ".role", str_cat(w, ".role must be 'user', 'assistant' or 'system', got '", brief_text(role), "'"));
  }
  // A final assistant turn is a prefill that Anthropic continues; shardlm's
  // chat path always opens a new assistant turn, so it is refused rather
  // than answered as something else.
  if (string_field(msgs->back(), "role") == "assistant" && !count_tokens)
    bad(str_cat("messages[", msgs->size() - 1, "]"), "a final assistant message (prefill) is not supported: end with a user message");
  chat["messages"] = messages;

  if (const ordered_json* t = find(body, "tools")) {
    ordered_json tools = translate_tools(*t);
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (const ordered_json* tc = find(body, "tool_choice")) {
    translate_tool_choice(*tc, &chat);
    if (!chat.contains("tools")) {
      if (chat["tool_choice"] == "none" || chat["tool_choice"] == "auto") chat.erase("tool_choice");
      else bad("tool_choice", "'tool_choice' forcing a tool needs 'tools'");
    }
    // count_tokens: the prompt is the same whatever the choice; no grammar.
    if (count_tokens && chat.contains("tool_choice") && chat["tool_choice"] != "none") chat["tool_choice"] = "auto";
  }

  ordered_json kwargs = ordered_json::object();
  if (const ordered_json* th = find(body, "thinking")) {
    const std::string type = th->is_object() ? string_field(*th, "type") : "";
    if (type == "enabled")
      bad("thinking.budget_tokens",
          "thinking {type: \"enabled\", budget_tokens} is not supported: shardlm does not cap reasoning separately from "
          "max_tokens. Send thinking {type: \"adaptive\"} (the model thinks as its chat template lets it; thinking "
          "blocks come from --reasoning-parser) or {type: \"disabled\"}");
    if (type == "disabled") kwargs["enable_thinking"] = false;  // Qwen3's switch; other templates ignore it
    else if (type != "adaptive") bad("thinking.type", "thinking.type must be adaptive, enabled or disabled");
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = kwargs;

  if (const ordered_json* oc = find(body, "output_config")) {
    if (!oc->is_object()) bad("output_config", "'output_config' must be an object");
    for (auto it = oc->begin(); it != oc->end(); ++it) {
      if (it.key() == "effort") continue;  // a hint: the model's effort is its own
      if (it.key() == "format") {
        if (!it.value().is_null()) translate_format(it.value(), "output_config.format", &chat);
        continue;
      }
      bad("output_config." + it.key(), str_cat("output_config.", it.key(), ": Extra inputs are not permitted"));
    }
  }
  if (const ordered_json* f = find(body, "output_format")) translate_format(*f, "output_format", &chat);
  // context_management (server-side clearing of old tool results) is a
  // hint: the conversation is served as sent. metadata.user_id, like
  // OpenAI's user, has no effect.
  if (const ordered_json* md = find(body, "metadata"))
    if (!md->is_object()) bad("metadata", "'metadata' must be an object");
  if (const ordered_json* cm = find(body, "context_management"))
    if (!cm->is_object()) bad("context_management", "'context_management' must be an object");
  if (const ordered_json* st = find(body, "service_tier"))
    if (!(st->is_string() && (*st == "auto" || *st == "standard_only")))
      bad("service_tier", "'service_tier' must be auto or standard_only: shardlm has one tier");

  if (count_tokens) {
    chat["max_tokens"] = 1;
    return chat;
  }
  const ordered_json* mt = find(body, "max_tokens");
  if (!mt) bad("max_tokens", "max_tokens: Field required");
  if (!mt->is_number_integer() || mt->get<int64_t>() < 1) bad("max_tokens", "max_tokens must be an integer >= 1, got " + brief_json(*mt));
  chat["max_tokens"] = *mt;
  if (const ordered_json* s = find(body, "stop_sequences")) {
    if (!s->is_array()) bad("stop_sequences", "'stop_sequences' must be a list of strings");
    for (const auto& x : *s)
      if (!x.is_string() || x.get<std::string>().empty()) bad("stop_sequences", "'stop_sequences' must hold non-empty strings");
    if (!s->empty()) chat["stop"] = *s;
  }
  for (const char* k : {"temperature", "top_p", "top_k", "stream"})
    if (const ordered_json* v = find(body, k)) chat[k] = *v;
  if (const ordered_json* t = find(body, "temperature"))
    if (t->is_number() && (t->get<double>() < 0.0 || t->get<double>() > 1.0))
      bad("temperature", "temperature must be in [0, 1], got " + brief_json(*t));
  return chat;
}

std::string anthropic_stop_reason(const std::string& finish_reason, bool tool_called,
                                  const std::optional<std::string>& stop_string) {
  if (finish_reason == "length") return "max_tokens";
  if (tool_called) return "tool_use";
  if (stop_string) return "stop_sequence";
  return "end_turn";
}

ordered_json anthropic_usage_json(const Usage& u) {
  return ordered_json{{"input_tokens", u.prompt_tokens - u.cached_tokens},
                      {"cache_creation_input_tokens", 0},
                      {"cache_read_input_tokens", u.cached_tokens},
                      {"output_tokens", u.completion_tokens}};
}

namespace {

ToolParserOptions anthropic_tool_ids() {
  ToolParserOptions o;
  o.make_id = [] { return random_id("toolu_"); };
  return o;
}

// A tool call's arguments as the tool_use block's input (an object).
ordered_json tool_input(const std::string& arguments) {
  if (arguments.empty()) return ordered_json::object();
  try {
    ordered_json v = parse_bounded_json(arguments, "tool call arguments");
    if (v.is_object()) return v;
  } catch (const ApiException&) {
  }
  return ordered_json::object();  // cut short (max_tokens): no valid input to give
}

void lstrip(std::string* s) { s->erase(0, s->find_first_not_of(" \t\r\n")); }

}  // namespace

ordered_json anthropic_message_json(const ParsedRequest& request, const std::string& id, const std::string& model,
                                    const CollectedOutput& output) {
  ChatOutputParser parser(request.output, anthropic_tool_ids());
  ChatMessage m;
  for (ChatDelta d : {parser.feed(output.text), parser.finish()}) {
    m.reasoning += d.reasoning;
    m.content += d.content;
    accumulate(d.tool_calls, &m.tool_calls);
  }
  ordered_json content = ordered_json::array();
  if (!m.reasoning.empty()) content.push_back({{"type", "thinking"}, {"thinking", m.reasoning}, {"signature", ""}});
  lstrip(&m.content);
  if (!m.content.empty()) content.push_back({{"type", "text"}, {"text", m.content}});
  for (const auto& c : m.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
  return ordered_json{{"id", id},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", model},
                      {"content", content},
                      {"stop_reason", anthropic_stop_reason(output.finish_reason, !m.tool_calls.empty(), output.stop_string)},
                      {"stop_sequence", output.stop_string && m.tool_calls.empty() ? ordered_json(*output.stop_string) : ordered_json()},
                      {"usage", anthropic_usage_json(output.usage)}};
}

AnthropicStreamEncoder::AnthropicStreamEncoder(const ParsedRequest& request, std::string id, std::string model)
    : id_(std::move(id)), model_(std::move(model)), parser_(request.output, anthropic_tool_ids()) {}

std::string AnthropicStreamEncoder::start(int64_t n_prompt_tokens) {
  ordered_json message = {{"id", id_},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"model", model_},
                          {"content", ordered_json::array()},
                          {"stop_reason", nullptr},
                          {"stop_sequence", nullptr},
                          {"usage", anthropic_usage_json(Usage{n_prompt_tokens, 0, 0})}};
  return sse_frame("message_start", {{"type", "message_start"}, {"message", message}}) +
         sse_frame("ping", {{"type", "ping"}});
}

void AnthropicStreamEncoder::open(Block kind, std::string* out, const ordered_json& content_block) {
  block_ = kind;
  *out += sse_frame("content_block_start", {{"type", "content_block_start"}, {"index", n_blocks_}, {"content_block", content_block}});
}

void AnthropicStreamEncoder::close(std::string* out) {
  if (block_ == Block::kNone) return;
  *out += sse_frame("content_block_stop", {{"type", "content_block_stop"}, {"index", n_blocks_}});
  ++n_blocks_;
  block_ = Block::kNone;
  open_call_ = -1;
}

void AnthropicStreamEncoder::add(const ChatDelta& d, std::string* out) {
  auto delta = [&](const ordered_json& body) {
    *out += sse_frame("content_block_delta", {{"type", "content_block_delta"}, {"index", n_blocks_}, {"delta", body}});
  };
  if (!d.reasoning.empty()) {
    if (block_ != Block::kThinking) {
      close(out);
      open(Block::kThinking, out, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    delta({{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    std::string text = d.content;
    if (block_ != Block::kText) lstrip(&text);  // as the whole message: no block of bare whitespace
    if (!text.empty()) {
      if (block_ != Block::kText) {
        close(out);
        open(Block::kText, out, {{"type", "text"}, {"text", ""}});
      }
      delta({{"type", "text_delta"}, {"text", text}});
    }
  }
  for (const auto& t : d.tool_calls) {
    if (block_ != Block::kToolUse || t.index != open_call_) {
      close(out);
      open(Block::kToolUse, out, {{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", ordered_json::object()}});
      open_call_ = t.index;
    }
    if (!t.arguments.empty()) delta({{"type", "input_json_delta"}, {"partial_json", t.arguments}});
  }
}

std::string AnthropicStreamEncoder::feed(const GenerateEvent& e) {
  std::string out;
  add(parser_.feed(e.text), &out);
  if (e.finish_reason) {
    add(parser_.finish(), &out);
    finish_reason_ = *e.finish_reason;
    stop_string_ = e.stop_string;
  }
  return out;
}

std::string AnthropicStreamEncoder::finish(const Usage& usage) {
  std::string out;
  close(&out);
  const bool called = parser_.tool_called();
  ordered_json delta = {{"stop_reason", anthropic_stop_reason(finish_reason_, called, stop_string_)},
                        {"stop_sequence", stop_string_ && !called ? ordered_json(*stop_string_) : ordered_json()}};
  out += sse_frame("message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", anthropic_usage_json(usage)}});
  out += sse_frame("message_stop", {{"type", "message_stop"}});
  return out;
}

namespace {

void reply(httplib::Response& res, int status, const ordered_json& body) { reply_agent_json(res, status, body); }

// Runs a handler, answering what it throws in Anthropic's error shape.
template <typename Fn>
void anthropic_guarded(httplib::Response& res, Fn&& fn) {
  agent_guarded(res, fn, [](const ApiError& e) { return anthropic_error_json(e.status, e.message); });
}

void handle_messages(const httplib::Request& req, httplib::Response& res, const RouteContext& ctx) {
  ordered_json body = agent_json_body(req, ctx);
  ParsedRequest parsed = parse_translated_chat(translate_anthropic_request(body, false), ctx);
  const std::string model = served_model(parsed, ctx);
  const std::string id = random_id("msg_");
  parsed.prompts.at(0).request_id = id;
  auto tracked = std::make_shared<TrackedRequest>(ctx, ctx.backend.submit(parsed.prompts.at(0)));

  if (!parsed.stream) {
    CollectedOutput output;
    if (!collect_output(tracked->stream(), &output)) {
      res.status = 499;  // the client hung up; nobody reads this
      return;
    }
    if (!output.error.empty()) throw ApiException({500, output.error, "api_error", "", ""});
    reply(res, 200, anthropic_message_json(parsed, id, model, output));
    return;
  }

  auto encoder = std::make_shared<AnthropicStreamEncoder>(parsed, id, model);
  auto started = std::make_shared<bool>(false);
  const int64_t n_prompt = static_cast<int64_t>(parsed.prompts[0].prompt_ids.size());
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [tracked, encoder, started, n_prompt](size_t, httplib::DataSink& sink) {
        RequestStream& s = tracked->stream();
        auto write = [&](const std::string& frames) {
          if (frames.empty() || sink.write(frames.data(), frames.size())) return true;
          s.cancel();  // the client went away: free its sequence now
          return false;
        };
        if (!*started) {
          *started = true;
          if (!write(encoder->start(n_prompt))) return false;
        }
        if (!s.done()) {
          std::vector<GenerateEvent> events;
          s.next(&events, std::chrono::milliseconds(50));
          for (const auto& e : events) {
            if (!e.error.empty()) {
              write(sse_frame("error", anthropic_error_json(500, e.error)));
              s.cancel();
              return false;
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
        write(encoder->finish(stream_usage(s)));
        sink.done();
        return true;
      },
      [tracked](bool) mutable { tracked.reset(); });
}

void handle_count_tokens(const httplib::Request& req, httplib::Response& res, const RouteContext& ctx) {
  ordered_json body = agent_json_body(req, ctx);
  ParsedRequest parsed = parse_translated_chat(translate_anthropic_request(body, true), ctx);
  served_model(parsed, ctx);
  reply(res, 200, {{"input_tokens", parsed.prompts.at(0).prompt_ids.size()}});
}

}  // namespace

void install_anthropic_routes(ConnectionServer& http, const RouteContext& ctx) {
  // httplib matches the path without the query, so ?beta=true (Claude Code) lands here too.
  http.Post("/v1/messages", [ctx](const httplib::Request& req, httplib::Response& res) {
    anthropic_guarded(res, [&] { handle_messages(req, res, ctx); });
  });
  http.Post("/v1/messages/count_tokens", [ctx](const httplib::Request& req, httplib::Response& res) {
    anthropic_guarded(res, [&] { handle_count_tokens(req, res, ctx); });
  });
}

}  // namespace shardlm::server
