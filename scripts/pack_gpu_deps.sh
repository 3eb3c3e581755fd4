#!/usr/bin/env bash
# Packs the build dependencies the GPU machine lacks (no network, no Debian -dev packages there)
# into .deps/ (gitignored), for scripts/gpu_check.sh: headers, libraries and CMake config files of
# nlohmann-json, CLI11, fmt and GoogleTest, as installed on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# The shared tool lives beside the checkout (../shared/tools/pack-deps), not at a fixed path.
pack_deps=../shared/tools/pack-deps
if [[ ! -x $pack_deps ]]; then
  echo "pack_gpu_deps: ${PWD%/*}/shared/tools/pack-deps is missing (or not executable):" \
    "this script needs the shared pack-deps tool next to the checkout, in ../shared/tools/" >&2
  exit 1
fi
rm -rf .deps
"$pack_deps" .deps nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libgtest-dev
echo "pack_gpu_deps: configure with -DCMAKE_PREFIX_PATH=$PWD/.deps/usr (scripts/gpu_check.sh does)"
