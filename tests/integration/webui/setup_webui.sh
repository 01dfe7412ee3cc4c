#!/usr/bin/env bash
# ctest fixture: installs puppeteer-core (package.json here) from npm into
# BINARY_DIR/.cache/webui-browser, once; reruns are offline unless
# package.json changed. Never committed. The browser is Debian's chromium
# (scripts/install-deps.sh): puppeteer-core downloads none.
#   usage: setup_webui.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=${1:?usage: setup_webui.sh SOURCE_DIR BINARY_DIR}
bin=${2:?usage: setup_webui.sh SOURCE_DIR BINARY_DIR}
here=$src/tests/integration/webui
dest=$bin/.cache/webui-browser
mkdir -p "$dest"
if ! command -v chromium >/dev/null; then
  echo "FAIL: chromium is not installed (apt-get install chromium; scripts/install-deps.sh lists it)" >&2
  exit 1
fi
if [[ -f $dest/node_modules/puppeteer-core/package.json && -f $dest/package.json ]] && cmp -s "$here/package.json" "$dest/package.json"; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "FAIL: npm is not installed; the web page tests install puppeteer-core from the npm registry" >&2
  exit 1
fi
cp "$here/package.json" "$dest/package.json"
if ! npm install --prefix "$dest" --no-audit --no-fund --no-package-lock --loglevel=error \
     --fetch-retries=2 --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 --fetch-timeout=120000 >&2; then
  rm -f "$dest/package.json"  # retry next time
  echo "FAIL: could not install puppeteer-core from the npm registry into $dest" >&2
  exit 1
fi
echo "installed puppeteer-core $(node -p "require('$dest/node_modules/puppeteer-core/package.json').version"); $(chromium --version 2>/dev/null)"
