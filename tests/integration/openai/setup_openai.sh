#!/usr/bin/env bash
# ctest fixture: install the official `openai` npm client (package.json here
# pins openai@^6) into BINARY_DIR/.cache/openai-client, once; reruns are
# offline unless package.json changed. Never committed.
#   usage: setup_openai.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=${1:?usage: setup_openai.sh SOURCE_DIR BINARY_DIR}
bin=${2:?usage: setup_openai.sh SOURCE_DIR BINARY_DIR}
here=$src/tests/integration/openai
dest=$bin/.cache/openai-client
mkdir -p "$dest"
if [[ -f $dest/node_modules/openai/package.json && -f $dest/package.json ]] && cmp -s "$here/package.json" "$dest/package.json"; then
  exit 0
fi
for tool in node npm; do
  if ! command -v $tool >/dev/null; then
    echo "FAIL: $tool is not installed; the OpenAI-client tests run the official openai npm package under Node >= 20" >&2
    exit 1
  fi
done
cp "$here/package.json" "$dest/package.json"
if ! npm install --prefix "$dest" --no-audit --no-fund --no-package-lock --loglevel=error \
     --fetch-retries=2 --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 --fetch-timeout=120000 >&2; then
  rm -f "$dest/package.json"  # retry next time
  echo "FAIL: could not install openai@^6 from the npm registry into $dest (is it reachable?)." \
       "The OpenAI-client integration tests cannot run without it." >&2
  exit 1
fi
version=$(node -p "require('$dest/node_modules/openai/package.json').version")
echo "installed openai $version into $dest"
