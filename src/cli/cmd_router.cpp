// shardlm router --backend http://HOST:PORT [--backend ...]: one OpenAI
// endpoint in front of replicas on other hosts.
#include <csignal>
#include <iostream>
#include <thread>

#include "cli/command.h"
#include "server/listener.h"
#include "server/router.h"

namespace shardlm::cli {
namespace {

server::Router* g_router = nullptr;

// --api-key '' (an unset variable in a unit file) would turn authentication
// off without a word: refuse it as a usage error.
CLI::Validator non_empty_api_key() {
  return CLI::Validator(
      [](std::string& key) {
        return key.empty() ? std::string("an empty key would turn authentication off (an unset variable?); "
                                         "give a key, or leave out --api-key to serve without one")
                           : std::string();
      },
      "KEY", "non-empty");
}

void on_signal(int) {
  if (g_router) std::thread([] { g_router->stop(); }).detach();
}

void setup(CLI::App& app) {
  auto* sub = app.add_subcommand("router", "Route OpenAI requests over replicas on other hosts (least work, prefix affinity, retries)");
  auto opts = std::make_shared<server::RouterOptions>();
  sub->add_option("--backend", opts->backends, "Base URL of a replica, e.g. http://10.0.0.2:8000 (repeat)")->required();
  sub->add_option("--host", opts->host, "Address to listen on")->capture_default_str();
  sub->add_option("--port", opts->port, "Port to listen on")->capture_default_str();
  sub->add_option("--api-key", opts->api_key, "Require this key from clients (and pass it on)")->check(non_empty_api_key());
  sub->add_option("--health-interval-ms", opts->health_interval_ms, "Backend health check period")->capture_default_str();
  sub->add_option("--threads-http", opts->n_http_threads, "Client connections served at once (threads start on demand)")
      ->capture_default_str()->check(CLI::Range(2, 1 << 16));
  sub->add_option("--max-header-bytes", opts->max_header_bytes, "Request line and headers larger than this get 431")
      ->capture_default_str()->check(CLI::Range(size_t{1024}, size_t{1} << 24));
  sub->add_option("--max-request-body-bytes", opts->max_body_bytes, "Larger bodies get 413")->capture_default_str();
  sub->add_option("--request-start-timeout", opts->request_start_timeout_s,
                  "Seconds a new client connection may stay silent before it gets 408")
      ->capture_default_str()->check(CLI::Range(1, 86400));
  sub->add_option("--max-attempts", opts->max_attempts, "Backends tried per request")->capture_default_str()->check(CLI::Range(1, 100));
  sub->add_flag("--no-web-ui{false}", opts->web_ui, "Do not serve the web page (chat, deployment, live metrics) at /");
  set_command_action(sub, [opts] {
    server::raise_open_file_limit();  // a client and an upstream socket per request
    server::Router router(*opts);
    router.bind();
    g_router = &router;
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::cerr << "shardlm router listening on http://" << opts->host << ":" << router.port() << " for "
              << opts->backends.size() << " backends\n";
    router.run();
    g_router = nullptr;
    return 0;
  });
}

}  // namespace
SHARDLM_REGISTER_COMMAND(setup);
}  // namespace shardlm::cli
