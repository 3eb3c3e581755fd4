#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (preset `release`, or `asan` with --asan)
# and runs every test with ctest; then (release) installs the Python package with its test
# extras into a virtual environment (.venv, or $TESSERA_VENV) and runs pytest. CUDA code is
# compiled when nvcc is found; GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
[ "${1:-}" = "--asan" ] && preset=asan
bash scripts/install_deps.sh
jobs=$(nproc)
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$jobs"
ctest --preset "$preset" -j "$jobs"

# ---- Python: `pip install .[test]` (scikit-build-core builds the same CMake project, with the
# nanobind extension; build/python/ is kept, so a second run only rebuilds what changed), then
# pytest. Not under --asan: the extension is loaded by an uninstrumented Python.
if [ "$preset" = release ]; then
  venv=${TESSERA_VENV:-.venv}
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  t0=$(date +%s)
  # The build requirements live in the venv and the build is not isolated: nanobind then keeps its
  # path, so build/python/ stays valid and a second run rebuilds nothing (an isolated build
  # recompiles nanobind from a new temporary folder each time).
  "$venv/bin/python" -m pip install --disable-pip-version-check -q "scikit-build-core>=0.10" "nanobind>=2.4"
  "$venv/bin/python" -m pip install --disable-pip-version-check -q --no-build-isolation ".[test]"
  echo "test.sh: pip install .[test] took $(( $(date +%s) - t0 )) s"
  "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
fi
