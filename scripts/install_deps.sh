#!/usr/bin/env bash
# Installs what Tessera needs from Debian's packages (only what is missing).
#   bash scripts/install_deps.sh [--clang]
# --clang: also clang and its runtimes (libFuzzer, ASan, UBSan), for the asan preset and fuzzing.
set -euo pipefail
pkgs=(cmake ninja-build ccache g++ pkg-config libopenblas-dev libhwy-dev nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev
      python3-dev python3-venv)
[ "${1:-}" = "--clang" ] && pkgs+=(clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
