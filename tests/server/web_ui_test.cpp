// The web page at / and GET /v1/deployment on the fake backend: content
// types, the Content-Security-Policy, --no-web-ui, the API key (page without
// it, API with it), the router's page and merged deployment. The page in a
// real browser: tests/integration/webui/webui.test.mjs.
#include <gtest/gtest.h>
#include <httplib.h>

#include <regex>
#include <thread>
#include <nlohmann/json.hpp>

#include "fake_backend.h"
#include "server/deployment.h"
#include "server/http_server.h"
#include "server/router.h"
#include "server/web_ui.h"

namespace shardlm::server {
namespace {

using testing::FakeBackend;
using json = nlohmann::json;

class WebUiTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}) {
    options.port = 0;
    options.served_model_names = {"tiny"};
    server_ = std::make_unique<HttpServer>(backend_, options);
    server_->bind();
    thread_ = std::thread([this] { server_->run(); });
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }
  void TearDown() override {
    if (server_) server_->stop(std::chrono::milliseconds(0));
    if (thread_.joinable()) thread_.join();
  }
  FakeBackend backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
  std::unique_ptr<httplib::Client> client_;
};

void expect_page_headers(const httplib::Result& r, const std::string& type_prefix) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type").rfind(type_prefix, 0), 0u) << r->get_header_value("Content-Type");
  const std::string csp = r->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("default-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("connect-src 'self'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("object-src 'none'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe-inline"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("unsafe-eval"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("http"), std::string::npos) << "no remote origin: " << csp;
  EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
}

TEST_F(WebUiTest, ServesThePageAndItsAssetsWithTheCsp) {
  start();
  auto page = client_->Get("/");
  expect_page_headers(page, "text/html");
  for (const char* id : {"chat-input", "chat-send", "chat-stop", "tab-chat", "tab-deployment", "tab-metrics", "api-key-input"})
    EXPECT_NE(page->body.find(std::string("data-testid=\"") + id + "\""), std::string::npos) << id;
  // Every script is a file from this origin: no inline script, no remote URL.
  const std::regex script(R"(<script\b([^>]*)>)");
  int n_scripts = 0;
  for (auto it = std::sregex_iterator(page->body.begin(), page->body.end(), script); it != std::sregex_iterator(); ++it) {
    ++n_scripts;
    EXPECT_NE((*it)[1].str().find("src=\"/"), std::string::npos) << (*it)[0];
  }
  EXPECT_GE(n_scripts, 1);
  EXPECT_EQ(page->body.find("http://"), std::string::npos);
  EXPECT_EQ(page->body.find("https://"), std::string::npos);
  expect_page_headers(client_->Get("/index.html"), "text/html");
  expect_page_headers(client_->Get("/app.js"), "text/javascript");
  expect_page_headers(client_->Get("/style.css"), "text/css");
  expect_page_headers(client_->Get("/favicon.svg"), "image/svg+xml");
  EXPECT_EQ(client_->Get("/nope.js")->status, 404);
}

// Model output reaches the DOM only as text: no asset parses HTML or evaluates strings.
TEST(WebUiAssets, NeverParseHtmlOrEvaluateCode) {
  ASSERT_GE(web_assets().size(), 5u);
  for (const WebAsset& a : web_assets()) {
    if (a.path.size() < 3 || a.path.substr(a.path.size() - 3) != ".js") continue;
    const std::string body(a.body);
    for (const char* banned : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                               "DOMParser", "createContextualFragment", "//cdn", "import(\"http", "import('http"})
      EXPECT_EQ(body.find(banned), std::string::npos) << a.path << " uses " << banned;
  }
  EXPECT_NE(find_web_asset("/"), nullptr);
  EXPECT_EQ(find_web_asset("/"), find_web_asset("/index.html"));
  EXPECT_EQ(find_web_asset("/missing.js"), nullptr);
}

TEST_F(WebUiTest, NoWebUiAnswers404AndTheApiStillServes) {
  ServerOptions o;
  o.web_ui = false;
  start(o);
  for (const char* path : {"/", "/index.html", "/app.js", "/style.css"}) {
    auto r = client_->Get(path);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_EQ(r->get_header_value("Content-Security-Policy"), "") << path;
  }
  EXPECT_EQ(client_->Get("/v1/models")->status, 200);
  EXPECT_EQ(client_->Get("/v1/deployment")->status, 200);
}

TEST_F(WebUiTest, WithAnApiKeyThePageLoadsWithoutItAndTheApiNeedsIt) {
  ServerOptions o;
  o.api_key = "sekrit";
  start(o);
  for (const WebAsset& a : web_assets()) EXPECT_EQ(client_->Get(std::string(a.path))->status, 200) << a.path;
  EXPECT_EQ(client_->Get("/v1/deployment")->status, 401);
  EXPECT_EQ(client_->Get("/v1/models")->status, 401);
  EXPECT_EQ(client_->Get("/v1/deployment", {{"Authorization", "Bearer wrong"}})->status, 401);
  auto ok = client_->Get("/v1/deployment", {{"Authorization", "Bearer sekrit"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(WebUiTest, DeploymentGivesPlannedAndMeasuredBytesPerRank) {
  start();
  auto r = client_->Get("/v1/deployment");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  json d = json::parse(r->body);
  EXPECT_EQ(d["object"], "deployment");
  EXPECT_EQ(d["layout"], json({{"tp", 2}, {"pp", 1}, {"dp", 1}, {"ep", 1}}));
  EXPECT_EQ(d["n_heads"], 4);
  ASSERT_EQ(d["ranks"].size(), 2u);
  const json& r1 = d["ranks"][1];
  EXPECT_EQ(r1["rank"], 1);
  EXPECT_EQ(r1["planned"]["weights"], 300'001);
  EXPECT_EQ(r1["measured"]["weights"], 300'002);  // the allocator's figure, not plan's
  EXPECT_EQ(r1["planned"]["workspace"], 500'000);
  EXPECT_TRUE(r1["measured"]["workspace"].is_null());  // not metered: null, never plan's figure
  EXPECT_EQ(r1["capacity_bytes"], 3'000'000);
  EXPECT_EQ(r1["q_heads"], json({{"begin", 2}, {"end", 4}, {"count", 2}}));
  EXPECT_EQ(r1["kv_heads"]["count"], 1);
}

TEST_F(WebUiTest, DeploymentWhileUnknownIs503) {
  backend_.layout = Deployment{};
  start();
  auto r = client_->Get("/v1/deployment");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_TRUE(json::parse(r->body)["error"]["message"].is_string());
}

TEST(MergeDeployments, RenumbersReplicasAcrossBackends) {
  Deployment a = FakeBackend::two_rank_layout();
  Deployment b = FakeBackend::two_rank_layout();
  b.dp = 2;
  b.ranks.push_back(b.ranks[0]);
  b.ranks.back().replica = 1;
  json merged = merge_deployments({deployment_json(a), deployment_json(b)});
  EXPECT_EQ(merged["layout"]["dp"], 3);
  ASSERT_EQ(merged["ranks"].size(), 5u);
  std::vector<int> replicas;
  for (const auto& r : merged["ranks"]) replicas.push_back(r["replica"].get<int>());
  EXPECT_EQ(replicas, (std::vector<int>{0, 0, 1, 1, 2}));
}

// The router serves the page itself (without the key) and merges its
// backends' deployments; --no-web-ui turns its page off.
TEST(RouterWebUi, ServesThePageAndMergesDeployments) {
  FakeBackend backends[2];
  std::unique_ptr<HttpServer> servers[2];
  std::thread threads[2];
  for (int i = 0; i < 2; ++i) {
    ServerOptions o;
    o.port = 0;
    o.api_key = "sekrit";
    servers[i] = std::make_unique<HttpServer>(backends[i], o);
    servers[i]->bind();
    threads[i] = std::thread([&, i] { servers[i]->run(); });
  }
  for (bool web_ui : {true, false}) {
    RouterOptions ro;
    ro.port = 0;
    ro.api_key = "sekrit";
    ro.web_ui = web_ui;
    for (auto& s : servers) ro.backends.push_back("http://127.0.0.1:" + std::to_string(s->port()));
    Router router(ro);
    router.bind();
    std::thread rt([&] { router.run(); });
    httplib::Client c("127.0.0.1", router.port());
    c.set_read_timeout(10, 0);
    auto page = c.Get("/");
    ASSERT_TRUE(page);
    if (web_ui) {
      expect_page_headers(page, "text/html");
      expect_page_headers(c.Get("/app.js"), "text/javascript");
    } else {
      // No page: / is one more path the router guards with the key.
      EXPECT_EQ(page->status, 401);
      EXPECT_EQ(c.Get("/", {{"Authorization", "Bearer sekrit"}})->status, 404);
    }
    EXPECT_EQ(c.Get("/v1/deployment")->status, 401);
    auto d = c.Get("/v1/deployment", {{"Authorization", "Bearer sekrit"}});
    ASSERT_TRUE(d);
    ASSERT_EQ(d->status, 200) << d->body;
    json body = json::parse(d->body);
    EXPECT_EQ(body["layout"]["dp"], 2);
    ASSERT_EQ(body["ranks"].size(), 4u);
    EXPECT_EQ(body["ranks"][3]["replica"], 1);
    router.stop();
    rt.join();
  }
  for (int i = 0; i < 2; ++i) {
    servers[i]->stop(std::chrono::milliseconds(0));
    threads[i].join();
  }
}

}  // namespace
}  // namespace shardlm::server
