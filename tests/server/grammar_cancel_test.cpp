// Grammar compilation through the HTTP server stops when the client hangs
// up: a pattern whose automaton grows without end (^(.{1,50}){30,80}$, under
// a table budget far above what it reaches in a second) is compiled on the
// request's thread, the client closes its socket once compilation has
// started, and the compile ends cancelled instead of running to the budget.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "grammar/compiled_grammar.h"
#include "grammar/grammar_compiler.h"
#include "server/http_server.h"
#include "server/structured_output.h"

namespace shardlm::server {
namespace {

using json = nlohmann::json;

std::shared_ptr<const grammar::TokenVocabulary> byte_vocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
  t.push_back("EOS");
  return std::make_shared<grammar::TokenVocabulary>(std::move(t), std::vector<int32_t>{256});
}

// The scripted backend with the real compile path (compile_grammar_or_400,
// polling the request's connection), and events for its start and end.
class CompilingBackend : public testing::FakeBackend {
 public:
  CompilingBackend() : compiler_(byte_vocab(), options()) {}
  static grammar::GrammarCompilerOptions options() {
    grammar::GrammarCompilerOptions o;
    o.max_table_bytes = size_t(8) << 30;  // only the client leaving stops this compile in time
    o.probe_bytes = size_t(1) << 20;
    return o;
  }
  std::shared_ptr<const grammar::CompiledGrammar> compile_grammar(const grammar::GrammarSpec& spec) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++started_;
      changed_.notify_all();
    }
    std::string outcome = "compiled";
    struct Done {
      const CompilingBackend& b;
      std::string& outcome;
      ~Done() {
        std::lock_guard<std::mutex> lock(b.mutex_);
        b.outcomes_.push_back(outcome);
        b.changed_.notify_all();
      }
    } done{*this, outcome};
    try {
      return compile_grammar_or_400(compiler_, spec);
    } catch (const ApiException& e) {
      outcome = e.error().message;
      throw;
    }
  }
  bool wait_started(int n, std::chrono::seconds limit) const {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, limit, [&] { return started_ >= n; });
  }
  std::string wait_outcome(size_t n, std::chrono::seconds limit) const {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!changed_.wait_for(lock, limit, [&] { return outcomes_.size() >= n; })) return "(still compiling)";
    return outcomes_[n - 1];
  }

 private:
  mutable grammar::GrammarCompiler compiler_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  mutable int started_ = 0;
  mutable std::vector<std::string> outcomes_;
};

TEST(GrammarCancel, CompilationStopsWhenTheClientLeaves) {
  CompilingBackend backend;
  backend.pace = std::chrono::milliseconds(0);
  ServerOptions options;
  options.port = 0;
  options.served_model_names = {"tiny"};
  HttpServer server(backend, options);
  server.bind();
  std::thread thread([&] { server.run(); });

  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string body = json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                {"max_tokens", 2}, {"guided_regex", "^(.{1,50}){30,80}$"}}
                               .dump();
  const std::string request = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  ASSERT_TRUE(backend.wait_started(1, std::chrono::seconds(20)));
  const auto closed = std::chrono::steady_clock::now();
  ::close(fd);
  // The 20 s bound only keeps a broken build from hanging the test.
  const std::string outcome = backend.wait_outcome(1, std::chrono::seconds(20));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - closed).count();
  EXPECT_NE(outcome.find("grammar compilation was cancelled"), std::string::npos) << outcome;
  EXPECT_LT(seconds, 5.0) << "the compile went on after the client left";  // measured, not a synchronisation

  // The server goes on answering.
  httplib::Client client("127.0.0.1", server.port());
  client.set_read_timeout(10, 0);
  auto r = client.Post("/v1/chat/completions",
                       json{{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}.dump(),
                       "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  server.stop(std::chrono::milliseconds(0));
  thread.join();
}

}  // namespace
}  // namespace shardlm::server
