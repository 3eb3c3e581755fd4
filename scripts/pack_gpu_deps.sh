#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on the GPU machine (no network, no Debian -dev packages
# there) beside the tree, all gitignored, all carried with the run
# (`carry: [".deps", ".whl", "third_party"]`):
#   .deps/  headers, libraries and CMake config files of nlohmann-json, CLI11, fmt and GoogleTest,
#           as installed on this machine (the shared pack-deps tool);
#   .whl/   the peers of the bench stage as wheels for CPython 3.12 (the GPU image's python3, which
#           already holds torch and triton, their only needs): Liger-Kernel and cut-cross-entropy,
#           pinned below; gpu_check.sh installs them with pip --no-index into build/gpu-site;
#   third_party/cudnn_frontend/  the header-only cuDNN frontend of attention's `cudnn`
#           implementation (scripts/fetch_cudnn_frontend.sh; CMake cannot fetch it there).
#   scripts/pack_gpu_deps.sh [--no-wheels]
set -euo pipefail
cd "$(dirname "$0")/.."
LIGER_VERSION=0.8.5        # liger-kernel (pure Python + Triton)
CCE_VERSION=25.1.1         # cut-cross-entropy (pure Python + Triton)
wheels=1
[ "${1:-}" = --no-wheels ] && wheels=0
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
bash scripts/fetch_cudnn_frontend.sh || echo "pack_gpu_deps: no cuDNN frontend: attention cudnn will be unavailable there" >&2
if [ $wheels = 1 ]; then
  rm -rf .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
    "liger-kernel==$LIGER_VERSION" "cut-cross-entropy==$CCE_VERSION"
  echo "pack_gpu_deps: wheels in $PWD/.whl: $(cd .whl && ls | tr '\n' ' ')"
fi
