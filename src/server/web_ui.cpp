#include "server/web_ui.h"

#include <httplib.h>

namespace shardlm::server {

const char* const kWebUiContentSecurityPolicy =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const WebAsset* find_web_asset(std::string_view path) {
  if (path == "/index.html") path = "/";
  for (const WebAsset& a : web_assets())
    if (a.path == path) return &a;
  return nullptr;
}

void install_web_ui(httplib::Server& http) {
  for (const WebAsset& asset : web_assets()) {
    auto handler = [&asset](const httplib::Request&, httplib::Response& res) {
      res.status = 200;
      res.set_header("Content-Security-Policy", kWebUiContentSecurityPolicy);
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_header("Referrer-Policy", "no-referrer");
      res.set_header("X-Frame-Options", "DENY");
      res.set_header("Cache-Control", "no-cache");  // a new binary serves its own page
      res.set_content(asset.body.data(), asset.body.size(), std::string(asset.content_type));
    };
    http.Get(std::string(asset.path), handler);
    if (asset.path == "/") http.Get("/index.html", handler);
  }
}

}  // namespace shardlm::server
