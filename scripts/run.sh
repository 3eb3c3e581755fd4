#!/usr/bin/env bash
# The main job: build if needed, then check and benchmark the kernels on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
tessera=build/release/bin/tessera
$tessera list
$tessera check linear_cross_entropy
