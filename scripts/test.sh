#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds (preset `release`, or `asan` with --asan)
# and runs every test with ctest; then (release) installs the Python package with its test
# extras into a virtual environment (.venv, or $TESSERA_VENV) and runs pytest. CUDA code is
# compiled when nvcc is found; GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
preset=release
[ "${1:-}" = "--asan" ] && preset=asan
# The asan preset builds with clang (its libFuzzer targets are fuzzed in the same tree by CI).
if [ "$preset" = asan ]; then bash scripts/install_deps.sh --clang; else bash scripts/install_deps.sh; fi
# Disk: a fresh clone's CI needs ~10 GiB (release + asan builds ~3, the venv ~6: PyPI's torch brings
# its CUDA libraries). Say so before a build fails halfway with ENOSPC (CI once did, in pip).
free_gib=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
echo "test.sh: $free_gib GiB free on $(df -P . | awk 'NR==2 {print $6}')"
[ "$free_gib" -ge 12 ] || echo "test.sh: WARNING: under 12 GiB free; the build and the venv need ~10" >&2
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
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q "scikit-build-core>=0.10" "nanobind>=2.4"
  # Without a GPU the package's CUDA module could never run (its tests skip), and the release
  # build above has compiled every CUDA file already: the wheel leaves it out (~2 CPU-minutes).
  defs=()
  nvidia-smi -L >/dev/null 2>&1 || defs=(-C cmake.define.TESSERA_CUDA=OFF)
  # The release preset's compiler, named the same way: ccache hashes the driver's name (c++ and
  # g++ differ), and with the same name and flags libtessera's objects come from the cache.
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/release/CMakeCache.txt)
  [ -n "$cxx" ] && defs+=(-C "cmake.define.CMAKE_CXX_COMPILER=$cxx")
  # A wheel tree configured with another compiler: CMake would drop its cache and scikit-build's
  # settings with it (the wheel then came out without tessera._ext), so it starts again.
  for cache in build/python/*/CMakeCache.txt; do
    [ -f "$cache" ] && [ -n "$cxx" ] || continue
    grep -q "^CMAKE_CXX_COMPILER:[A-Z]*=$cxx\$" "$cache" || { echo "test.sh: $(dirname "$cache") used another compiler: rebuilt"; rm -rf "$(dirname "$cache")"; }
  done
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q --no-build-isolation \
    "${defs[@]}" ".[test]"
  echo "test.sh: pip install .[test] took $(( $(date +%s) - t0 )) s"
  "$venv/bin/python" -m pytest python/tests -q -p no:cacheprovider
fi
