#!/usr/bin/env bash
# The Python extension built against this machine's python3 (its PyTorch, JAX), CUDA on, no BLAS
# CPU backend, in its own build folder (PIC; no C++ tests or tools), then staged as an importable
# package: PYTHONPATH=OUT_DIR makes `import tessera` load it. Used by gpu_check.sh's test stage.
#   scripts/gpu_python_package.sh BUILD_DIR OUT_DIR [extra cmake -D arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pybuild=$1 out=$2
shift 2
if [ ! -f "$pybuild/build.ninja" ]; then
  cmake -S "$root" -B "$pybuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_CPU_BACKEND=OFF \
    -DTESSERA_BUILD_PYTHON=ON -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_TOOLS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DPython_EXECUTABLE="$(command -v python3)" "$@"
fi
cmake --build "$pybuild" -j "${JOBS:-$(nproc)}" --target tessera_ext
so=$(ls "$pybuild"/python/_ext*.so 2> /dev/null | head -1)
[ -n "$so" ] || { echo "gpu_python_package: no _ext*.so under $pybuild/python" >&2; exit 1; }
rm -rf "$out/tessera" && mkdir -p "$out/tessera" && cp -r "$root"/python/tessera/. "$out/tessera"/ && ln -s "$so" "$out/tessera/"
PYTHONPATH=$out python3 -c 'import tessera; print("staged:", sorted(k["name"] for k in tessera.kernels()))'
