// The web page at / (chat, the deployment as a picture, live metrics): plain
// HTML, CSS and JavaScript from src/server/web/, embedded in the binary at
// build time (cmake/embed_web_assets.cmake). The page and its assets load
// without the API key; every API call it makes sends the key.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace httplib {
class Server;
}

namespace shardlm::server {

struct WebAsset {
  std::string_view path;          // "/" for index.html, else "/" + file name
  std::string_view content_type;
  std::string_view body;
};

// Every embedded file (generated source).
const std::vector<WebAsset>& web_assets();
// The asset served at this path, or null.
const WebAsset* find_web_asset(std::string_view path);

// The page's Content-Security-Policy: its own origin only, no inline script
// or style, no plugin, no framing.
extern const char* const kWebUiContentSecurityPolicy;

// Registers GET for every asset (with the CSP and nosniff headers). Not
// called under --no-web-ui: / is then a 404 like any unknown path.
void install_web_ui(httplib::Server& http);

}  // namespace shardlm::server
