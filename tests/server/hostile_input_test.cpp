// Hostile inputs of issue 21 through the real HTTP server over a scripted
// backend: each request is refused with a 4xx in OpenAI's error shape that
// names the limit or the field, and the same server then answers a normal
// request correctly. Deep inputs are 100,000 levels as strings: they must be
// refused without recursion (this suite also runs under ASan).
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_compiler.h"
#include "server/bounded_json.h"
#include "server/engine_backend.h"
#include "server/http_server.h"
#include "server/structured_output.h"
#include "tokenizer/chat_template/model_template.h"

namespace shardlm::server {
namespace {

using json = nlohmann::json;

constexpr int kDeep = 100'000;

std::string deep_array(int n) { return std::string(size_t(n), '[') + std::string(size_t(n), ']'); }

// The fake backend, with a real grammar compiler (byte tokens) so regex and
// json_schema constraints are compiled as serve compiles them.
class GrammarBackend : public testing::FakeBackend {
 public:
  // A small table budget by default, so that an exploding grammar is refused
  // in milliseconds (serve's default is 64 MiB).
  GrammarBackend() { configure(size_t(1) << 20, 0.0); }
  // Not while a request compiles.
  void configure(size_t max_table_bytes, double compile_timeout_s) {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
    bytes.push_back("");  // 256: the stop token
    grammar::GrammarCompilerOptions options;
    options.max_table_bytes = max_table_bytes;
    compiler_ = std::make_unique<grammar::GrammarCompiler>(
        std::make_shared<grammar::TokenVocabulary>(std::move(bytes), std::vector<int32_t>{256}), options);
    compile_timeout_s_ = compile_timeout_s;
  }
  std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const grammar::GrammarSpec& spec) const override {
    return compile_grammar_or_400(*compiler_, spec, compile_timeout_s_);
  }

 private:
  std::unique_ptr<grammar::GrammarCompiler> compiler_;
  double compile_timeout_s_ = 0.0;
};

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_.pace = std::chrono::milliseconds(0);
    backend_.script = "ok";
    ServerOptions options;
    options.port = 0;
    options.served_model_names = {"tiny"};
    server_ = std::make_unique<HttpServer>(backend_, options);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(20, 0);
  }
  void TearDown() override {
    server_->stop(std::chrono::milliseconds(0));
    thread_.join();
  }

  httplib::Result post_raw(const std::string& body, const std::string& path = "/v1/chat/completions",
                           const std::string& type = "application/json") {
    return client_->Post(path.c_str(), body, type.c_str());
  }
  // Asserts a 4xx OpenAI-shaped error whose message holds `needle` and
  // whose param is `param` (when given); the message must stay short.
  void expect_refused(const httplib::Result& r, int status, const std::string& needle, const std::string& param = "") {
    ASSERT_TRUE(r) << "no response: the server died or hung";
    EXPECT_EQ(r->status, status) << r->body.substr(0, 500);
    json body = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << r->body.substr(0, 500);
    const json& e = body["error"];
    ASSERT_TRUE(e["message"].is_string());
    const std::string message = e["message"].get<std::string>();
    EXPECT_NE(message.find(needle), std::string::npos) << message;
    EXPECT_LT(message.size(), 1000u) << "an error must not quote an unbounded user value";
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_TRUE(e.contains("param") && e.contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(e["param"], param) << message;
    }
  }
  // The same server still answers a normal chat request.
  void expect_healthy() {
    json req = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}};
    auto r = client_->Post("/v1/chat/completions", req.dump(), "application/json");
    ASSERT_TRUE(r) << "the server no longer answers";
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], "ok");
  }
  // A chat request whose `field` is the raw JSON text `value`.
  static std::string chat_with(const std::string& field, const std::string& value) {
    return R"({"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,")" + field + "\":" + value + "}";
  }

  GrammarBackend backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

// --- JSON nesting --------------------------------------------------------

TEST(BoundedJson, DepthScanSkipsStringsAndStopsAtTheLimit) {
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":[]}]})", 64), 4);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[[\"[[[["})", 64), 1);  // brackets in a string, escaped quote
  EXPECT_EQ(json_nesting_depth(R"(["\\"[[])", 64), 3);             // an escaped backslash ends the string
  EXPECT_EQ(json_nesting_depth(std::string(kDeep, '['), 64), 65);  // stops at limit + 1
}

TEST(BoundedJson, ParserRefusesDepthAndNamesTheField) {
  EXPECT_NO_THROW(parse_bounded_json("{\"a\":" + deep_array(63) + "}", "the body"));  // 64 levels in all
  try {
    parse_bounded_json("{\"a\":" + deep_array(64) + "}", "the body");
    FAIL() << "65 levels accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().param, "a");
    EXPECT_NE(e.error().message.find("nested deeper than 64 levels"), std::string::npos) << e.error().message;
  }
  try {
    parse_bounded_json(R"({"x":[1,2,{"y":1e400}]})", "the body");
    FAIL() << "1e400 accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().param, "x[2].y");
  }
}

// An object of n members costs n^2/2 key comparisons to build in
// ordered_json: refused as the parser reads, before the object exists.
std::string object_of(int n_members, const std::string& prefix = "k") {
  std::string o = "{";
  for (int i = 0; i < n_members; ++i) o += (i ? ",\"" : "\"") + prefix + std::to_string(i) + "\":1";
  return o + "}";
}

TEST(BoundedJson, ObjectsAndValuesAreBoundedWhileParsing) {
  EXPECT_NO_THROW(parse_bounded_json(object_of(2048), "the body"));
  try {
    parse_bounded_json("{\"a\":[" + object_of(80'000) + "]}", "the body");
    FAIL() << "80,000 members accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().status, 400);
    EXPECT_EQ(e.error().param, "a");
    EXPECT_NE(e.error().message.find("an object with more than 2048 members (the limit on JSON object members) in 'a'"),
              std::string::npos) << e.error().message;
  }
  try {  // at the top: no field to name
    parse_bounded_json(object_of(3000), "the body");
    FAIL() << "3,000 members accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().param, "");
    EXPECT_NE(e.error().message.find("more than 2048 members"), std::string::npos) << e.error().message;
  }
  // Many large objects: each within the member limit, too many comparisons in all.
  std::string many = "{\"a\":[";
  for (int k = 0; k < 5; ++k) many += (k ? "," : "") + object_of(2000);
  many += "]}";
  try {
    parse_bounded_json(many, "the body");
    FAIL() << "5 objects of 2,000 members accepted";
  } catch (const ApiException& e) {
    EXPECT_EQ(e.error().param, "a");
    EXPECT_NE(e.error().message.find("key comparisons to build them (the limit on JSON object work"), std::string::npos)
        << e.error().message;
  }
  std::string values = "[0";
  for (size_t i = 0; i < kMaxJsonValues; ++i) values += ",0";
  values += "]";
  try {
    parse_bounded_json(values, "the body");
    FAIL() << "1,000,001 values accepted";
  } catch (const ApiException& e) {
    EXPECT_NE(e.error().message.find("more than 1000000 values (the limit on JSON values)"), std::string::npos)
        << e.error().message;
  }
}

TEST_F(HostileInputTest, LargeObjectsAndLogitBiasAreRefusedEarly) {
  // 80,000 distinct keys (1 MB): 12-19 s of CPU before; refused at the 2,049th.
  expect_refused(post_raw(chat_with("chat_template_kwargs", object_of(80'000))), 400,
                 "more than 2048 members (the limit on JSON object members)", "chat_template_kwargs");
  expect_healthy();
  expect_refused(post_raw(chat_with("logit_bias", object_of(100'000, ""))), 400, "more than 2048 members", "logit_bias");
  expect_healthy();
  // Within the parser's limit, logit_bias has its own (1,024 entries; OpenAI allows 300).
  expect_refused(post_raw(chat_with("logit_bias", object_of(2000, ""))), 400, "'logit_bias' may hold at most 1024 entries",
                 "logit_bias");
  expect_healthy();
}

TEST_F(HostileInputTest, DeepJsonInAnyFieldIsRefusedWith400) {
  const std::string deep = deep_array(kDeep);
  for (const char* field : {"max_tokens", "temperature", "chat_template_kwargs", "no_such_field", "response_format"}) {
    SCOPED_TRACE(field);
    expect_refused(post_raw(chat_with(field, deep)), 400, "nested deeper than 64 levels", field);
    expect_healthy();
  }
  // Deep inside a message, and unbalanced (never closed).
  expect_refused(post_raw(R"({"messages":[{"role":"user","content":"hi","extra":)" + deep + "}]}"), 400,
                 "nested deeper than 64 levels", "messages");
  expect_refused(post_raw(std::string(kDeep, '[')), 400, "nested deeper than 64 levels");
  // Tool parameters, and /tokenize.
  expect_refused(post_raw(chat_with("tools", R"([{"type":"function","function":{"name":"f","parameters":)" + deep + "}}]")),
                 400, "nested deeper than 64 levels", "tools");
  expect_refused(post_raw(R"({"prompt":"hi","x":)" + deep + "}", "/tokenize"), 400, "nested deeper than 64 levels");
  expect_healthy();
}

TEST_F(HostileInputTest, DeepJsonInsideAStringIsRefusedNamingTheParameter) {
  const std::string deep = json(deep_array(kDeep)).dump();  // the JSON text as a JSON string
  expect_refused(post_raw(chat_with("guided_json", deep)), 400, "nested deeper than 64 levels", "guided_json");
  expect_healthy();
  const std::string call = R"({"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"hi"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
      "function":{"name":"f","arguments":)" + deep + "}}]},{\"role\":\"user\",\"content\":\"again\"}]}";
  expect_refused(post_raw(call), 400, "nested deeper than 64 levels", "messages[1].tool_calls[0].function.arguments");
  expect_healthy();
}

TEST_F(HostileInputTest, NestingUpToTheLimitIsServedAndBracketsInStringsDoNotCount) {
  // The body is level 1; chat_template_kwargs.a holds 62 more: 64 in all.
  auto r = post_raw(chat_with("chat_template_kwargs", "{\"a\":" + deep_array(62) + "}"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  expect_refused(post_raw(chat_with("chat_template_kwargs", "{\"a\":" + deep_array(63) + "}")), 400,
                 "nested deeper than 64 levels", "chat_template_kwargs");
  json req = {{"messages", {{{"role", "user"}, {"content", std::string(kDeep, '[')}}}}, {"max_tokens", 2}};
  backend_.max_len = 1 << 20;
  r = post_raw(req.dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
}

TEST_F(HostileInputTest, ErrorsQuoteOnlyABriefUserValue) {
  const std::string huge = json(std::string(200'000, 'x')).dump();
  expect_refused(post_raw(chat_with("temperature", huge)), 400, "'temperature' must be a number", "temperature");
  std::string list = "[";
  for (int i = 0; i < 50'000; ++i) list += "12345678,";
  list += "1]";
  expect_refused(post_raw(chat_with("max_tokens", list)), 400, "'max_tokens' must be an integer", "max_tokens");
  // Invalid UTF-8 is refused by the parser, naming where, never quoted raw.
  expect_refused(post_raw(chat_with("temperature", "\"\xff\xfe\"")), 400, "not valid JSON at 'temperature'", "temperature");
  expect_healthy();
}

// --- Type mismatches are 400s naming the field ------------------------------

TEST_F(HostileInputTest, TypeMismatchesAre400sNamingTheField) {
  expect_refused(post_raw(chat_with("max_tokens", "1e400")), 400, "number overflow", "max_tokens");
  expect_refused(post_raw(chat_with("temperature", "-1e400")), 400, "number overflow", "temperature");
  expect_refused(post_raw(R"({"messages":[{"role":"user","content":[{"type":7,"text":"hi"}]}]})"), 400, "only text parts",
                 "messages[0].content");
  expect_refused(post_raw(chat_with("tools", R"([{"type":7,"function":{"name":"f"}}])")), 400,
                 "tools[0].type must be \"function\"", "tools[0].type");
  expect_refused(post_raw(chat_with("tool_choice", R"({"type":7,"function":{"name":"f"}})")), 400, "tool_choice",
                 "tool_choice");
  expect_refused(post_raw(R"({"prompt":"hi","add_special_tokens":"yes"})", "/tokenize"), 400,
                 "'add_special_tokens' must be true or false", "add_special_tokens");
  // A json_schema keyword of the wrong type.
  expect_refused(post_raw(chat_with("response_format",
                                    R"({"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","minLength":"3"}}})")),
                 400, "wrong type", "response_format");
  expect_healthy();
  auto r = post_raw(R"({"prompt":"hi","add_special_tokens":false})", "/tokenize");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// --- Regex and json_schema pattern ------------------------------------------

TEST_F(HostileInputTest, DeepOrRunawayRegexesAreRefusedNamingTheParameter) {
  const std::string groups = std::string(50'000, '(') + "a" + std::string(50'000, ')');
  const std::string stars = "a" + std::string(100'000, '*');
  expect_refused(post_raw(chat_with("guided_regex", json(groups).dump())), 400, "nested deeper than 64 levels",
                 "guided_regex");
  expect_healthy();
  expect_refused(post_raw(chat_with("guided_regex", json(stars).dump())), 400, "quantifiers in a row", "guided_regex");
  expect_healthy();
  for (const std::string& pattern : {groups, stars}) {
    json rf = {{"type", "json_schema"},
               {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}, {"properties", {{"s", {{"type", "string"}, {"pattern", pattern}}}}}}}}}};
    expect_refused(post_raw(chat_with("response_format", rf.dump())), 400, "#/properties/s/pattern", "response_format");
    expect_healthy();
  }
  // Within the limits, a pattern compiles and is served.
  auto r = post_raw(chat_with("guided_regex", json("(((o)))k*?").dump()));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
}

TEST_F(HostileInputTest, ExplodingGrammarsAreRefusedNamingTheBudget) {
  // Expands to a DFA whose states each track thousands of NFA states: minutes
  // of compile and 150 MiB per grammar before the table budget.
  expect_refused(post_raw(chat_with("guided_regex", json("^(.{1,50}){30,80}$").dump())), 400,
                 "MiB of automaton tables (the grammar table budget, serve --grammar-table-memory)", "guided_regex");
  expect_healthy();
  json rf = {{"type", "json_schema"},
             {"json_schema", {{"name", "x"}, {"schema", {{"type", "string"}, {"pattern", "^(.{1,20}){10,30}$"}}}}}};
  expect_refused(post_raw(chat_with("response_format", rf.dump())), 400, "the grammar table budget", "response_format");
  expect_healthy();
}

TEST_F(HostileInputTest, AGrammarPastItsCompileTimeIsRefusedNamingTheFlag) {
  backend_.configure(size_t(1) << 40, 0.001);  // no table budget in reach: only the deadline stops it
  expect_refused(post_raw(chat_with("guided_regex", json("^(.{1,50}){30,80}$").dump())), 400,
                 "took more than 0.001 s (serve --grammar-compile-timeout)", "guided_regex");
  expect_healthy();
}

TEST_F(HostileInputTest, LongRefChainsInASchemaAreRefused) {
  // 2,000 definitions, each referring to the next: a walk 2,000 deep.
  json defs = json::object();
  for (int i = 0; i < 2000; ++i)
    defs["d" + std::to_string(i)] = i + 1 < 2000 ? json{{"$ref", "#/$defs/d" + std::to_string(i + 1)}} : json{{"type", "integer"}};
  json schema = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  json rf = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}};
  expect_refused(post_raw(chat_with("response_format", rf.dump())), 400, "subschemas deep", "response_format");
  expect_healthy();
}

// --- Reserved template variables ------------------------------------------------

TEST_F(HostileInputTest, ChatTemplateKwargsMayNotOverrideWhatShardlmSets) {
  for (const char* name : {"messages", "tools", "add_generation_prompt", "bos_token"}) {
    SCOPED_TRACE(name);
    expect_refused(post_raw(chat_with("chat_template_kwargs", std::string("{\"") + name + "\":[{\"role\":\"system\"}]}")),
                   400, std::string("may not set '") + name + "'", "chat_template_kwargs");
  }
  auto r = post_raw(chat_with("chat_template_kwargs", R"({"enable_thinking":false})"));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// --- Content type -------------------------------------------------------------

TEST_F(HostileInputTest, ContentTypeMustBeExactlyJson) {
  const std::string ok = R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":2})";
  expect_refused(post_raw(ok, "/v1/chat/completions", "application/jsonp"), 415, "Content-Type must be application/json");
  expect_refused(post_raw(ok, "/v1/chat/completions", "application/json-seq"), 415, "Content-Type must be application/json");
  auto r = post_raw(ok, "/v1/chat/completions", "Application/JSON; charset=utf-8");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

// --- Chat templates: budgets at render, and the client leaving ---------------

// Renders a real chat template as serve does (render_chat_or_400), with small
// budgets so that hostile renders stop in milliseconds even under ASan. The
// first message's content picks a hostile branch.
constexpr const char* kHostileTemplate = R"({%- macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro -%}
{%- set c = messages[0].content -%}
{%- if c == 'exponential' -%}{{ f(60) }}
{%- elif c == 'doubling' -%}{% set ns = namespace(x=[1]) %}{% for i in range(40) %}{% set ns.x = ns.x + ns.x %}{% endfor %}
{%- elif c == 'format' -%}{{ ('{0}' * 8).format('x' * 20000) }}
{%- else -%}{% for m in messages %}{{ m.role }}:{{ m.content }}
{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}{% endif %})";

class TemplateBackend : public GrammarBackend {
 public:
  explicit TemplateBackend(chat_template::Limits limits)
      : template_{chat_template::ChatTemplate::compile(kHostileTemplate, limits), "", "", kHostileTemplate} {}
  std::string render_chat(const ordered_json& messages, const ordered_json& tools, bool add_generation_prompt,
                          const ordered_json& kwargs) const override {
    chat_template::ChatInputs in;
    in.messages = messages;
    in.tools = tools;
    in.add_generation_prompt = add_generation_prompt;
    in.extra = kwargs;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++n_started_;
      changed_.notify_all();
    }
    std::string outcome = "rendered";
    struct Done {
      const TemplateBackend& b;
      std::string& outcome;
      ~Done() {
        std::lock_guard<std::mutex> lock(b.mutex_);
        b.outcomes_.push_back(outcome);
        b.changed_.notify_all();
      }
    } done{*this, outcome};
    try {
      return render_chat_or_400(template_, in);
    } catch (const ApiException& e) {
      outcome = e.error().message;
      throw;
    }
  }
  // Waits (on the backend's own events, bounded by `limit` against a hang)
  // until n renders have started / finished.
  bool wait_started(int n, std::chrono::seconds limit) const {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return n_started_ >= n; });
  }
  std::string wait_outcome(size_t n, std::chrono::seconds limit) const {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!changed_.wait_for(lock, limit, [&] { return outcomes_.size() >= n; })) return "(still rendering)";
    return outcomes_[n - 1];
  }

 private:
  chat_template::ModelChatTemplate template_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable int n_started_ = 0;
  mutable std::vector<std::string> outcomes_;
};

class HostileTemplateTest : public ::testing::Test {
 protected:
  void start(chat_template::Limits limits) {
    backend_ = std::make_unique<TemplateBackend>(limits);
    backend_->pace = std::chrono::milliseconds(0);
    backend_->script = "ok";
    ServerOptions options;
    options.port = 0;
    options.served_model_names = {"tiny"};
    server_ = std::make_unique<HttpServer>(*backend_, options);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(20, 0);
  }
  void TearDown() override {
    if (!server_) return;
    server_->stop(std::chrono::milliseconds(0));
    thread_.join();
  }
  static std::string chat(const std::string& content) {
    return json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", 2}}.dump();
  }
  void expect_400(const std::string& content, const std::string& needle) {
    auto r = client_->Post("/v1/chat/completions", chat(content), "application/json");
    ASSERT_TRUE(r) << "no response: the server died or hung";
    EXPECT_EQ(r->status, 400) << r->body.substr(0, 500);
    json e = json::parse(r->body)["error"];
    EXPECT_NE(e["message"].get<std::string>().find(needle), std::string::npos) << e.dump();
    EXPECT_LT(e["message"].get<std::string>().size(), 1000u);
    EXPECT_EQ(e["param"], "messages");
  }
  void expect_healthy() {
    auto r = client_->Post("/v1/chat/completions", chat("hi"), "application/json");
    ASSERT_TRUE(r) << "the server no longer answers";
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["message"]["content"], "ok");
  }

  std::unique_ptr<TemplateBackend> backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(HostileTemplateTest, RenderBudgetsAre400sNamingTheLimit) {
  chat_template::Limits limits;
  limits.max_steps = 200'000;
  limits.max_list_items = 10'000;
  limits.max_output_bytes = 64 << 10;
  start(limits);
  expect_400("exponential", "evaluation steps (serve --chat-template-max-steps)");
  expect_healthy();
  expect_400("doubling", "more than 10000 items (serve --chat-template-max-list-items)");
  expect_healthy();
  expect_400("format", "exceeds the limit of 65536 bytes (serve --chat-template-max-bytes)");
  expect_healthy();
}

TEST_F(HostileTemplateTest, RenderStopsWhenTheClientLeaves) {
  chat_template::Limits limits;
  limits.max_steps = size_t{1} << 50;  // only the client leaving can stop f(60)
  start(limits);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string body = chat("exponential");
  const std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  ASSERT_TRUE(backend_->wait_started(1, std::chrono::seconds(20)));
  ::close(fd);
  // The render notices the hang-up at its next poll (every 65,536 steps).
  const std::string outcome = backend_->wait_outcome(1, std::chrono::seconds(20));
  EXPECT_NE(outcome.find("the render was cancelled (the client has gone)"), std::string::npos) << outcome;
  expect_healthy();
}

}  // namespace
}  // namespace shardlm::server
