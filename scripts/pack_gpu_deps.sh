#!/usr/bin/env bash
# Packs the build dependencies the GPU machine lacks (no network, no Debian -dev packages there)
# into .deps/ (gitignored), for scripts/gpu_check.sh: headers, libraries and CMake config files of
# nlohmann-json, CLI11, fmt and GoogleTest, as installed on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps
/work/shared/tools/pack-deps .deps nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libgtest-dev
echo "pack_gpu_deps: configure with -DCMAKE_PREFIX_PATH=$PWD/.deps/usr (scripts/gpu_check.sh does)"
