#!/usr/bin/env bash
# ctest fixture: fetch the tokenizers (once) and regenerate the JS reference
# ids when the corpus or the generator changed.
#   usage: setup_reference.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=${1:?usage: setup_reference.sh SOURCE_DIR BINARY_DIR}
bin=${2:?usage: setup_reference.sh SOURCE_DIR BINARY_DIR}
here=$src/tests/tokenizer
cache=$bin/.cache/tokenizers
bash "$here/fetch_tokenizers.sh" "$cache"
out=$cache/reference.json
if [[ ! -f $out || -n $(find "$here/corpus" "$here/make_reference.mjs" -newer "$out" -print -quit) ]]; then
  if ! command -v node >/dev/null; then
    echo "FAIL: node is not installed; it runs the JavaScript reference tokenizer" >&2
    exit 1
  fi
  node "$here/make_reference.mjs" "$cache" "$here/corpus" "$out.tmp"
  mv "$out.tmp" "$out"
fi
