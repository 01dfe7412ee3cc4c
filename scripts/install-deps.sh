#!/usr/bin/env bash
# Installs what shardlm needs to build, test and run on Debian 12 (as root).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libssl-dev zlib1g-dev
  libpcre2-dev libutf8proc-dev libxxhash-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev
  python3 python3-numpy python3-jinja2 python3-jsonschema
  gnuplot-nox curl
  chromium
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# (The libFuzzer targets, -DSHARDLM_FUZZ=ON, also need clang libclang-rt-14-dev.)
# Node.js (tokenizer reference, the official openai client): keep an existing one.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)
if ((${#missing[@]})); then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
