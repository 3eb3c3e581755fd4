#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (preset `release`, or `asan` with --asan)
# and runs every test with ctest. CUDA code is compiled when nvcc is found; GPU tests skip
# themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
[ "${1:-}" = "--asan" ] && preset=asan
bash scripts/install_deps.sh
jobs=$(nproc)
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$jobs"
ctest --preset "$preset" -j "$jobs"
