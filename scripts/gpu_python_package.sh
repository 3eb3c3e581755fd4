#!/usr/bin/env bash
# The Python extension built against this machine's python3 (its PyTorch, JAX), CUDA on, no BLAS
# CPU backend, in its own build folder (PIC; no C++ tests or tools), then staged as an importable
# package: PYTHONPATH=OUT_DIR makes `import tessera` load it. Used by gpu_check.sh's test stage.
# Host code carries debug info (-g, same code): a crash's backtrace (gpu_python_probe.sh) names lines.
#   scripts/gpu_python_package.sh BUILD_DIR OUT_DIR [extra cmake -D arguments...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { echo "usage: gpu_python_package.sh BUILD_DIR OUT_DIR [cmake -D...]" >&2; exit 2; }
pybuild=$(mkdir -p "$1" && cd "$1" && pwd) out=$(mkdir -p "$2" && cd "$2" && pwd)  # absolute: the _ext link
shift 2
if [ ! -f "$pybuild/build.ninja" ]; then
  cmake -S "$root" -B "$pybuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON -DTESSERA_CPU_BACKEND=OFF \
    -DTESSERA_BUILD_PYTHON=ON -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_TOOLS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_CXX_FLAGS=-g \
    -DPython_EXECUTABLE="$(command -v python3)" "$@"
fi
# tessera_cuda too: the extension does not link the CUDA module, libtessera loads it from its own
# folder at run time (without it every cuda implementation is "unavailable" and the tests skip).
cmake --build "$pybuild" -j "${JOBS:-$(nproc)}" --target tessera_ext tessera_cuda
so=$(ls "$pybuild"/python/_ext*.so 2> /dev/null | head -1 || true)
[ -n "$so" ] || { echo "gpu_python_package: no _ext*.so under $pybuild/python" >&2; exit 1; }
rm -rf "$out/tessera" && mkdir -p "$out/tessera" && cp -r "$root"/python/tessera/. "$out/tessera"/ && ln -s "$so" "$out/tessera/"
PYTHONPATH=$out python3 -c '
import tessera
assert "cuda" in tessera._ext.ffi_targets(), "the extension has no CUDA FFI handler: JAX on a GPU would find none"
# The handler in every build (a CPU wheel too) proves little; that it reaches the GPU: a device
# pointer names its device through libtessera (the hook the handler uses), or JAX sees no GPU.
try:
    import jax, jax.numpy as jnp, numpy as np
    gpus = jax.devices("gpu")
except Exception:
    gpus = []
if gpus:
    import tessera.jax as tj
    lhs, rhs, sizes = np.ones((4, 8), np.float32), np.ones((2, 8, 3), np.float32), np.array([1, 3], np.int64)
    out = np.asarray(tj.grouped_matmul(*(jax.device_put(a, gpus[0]) for a in (lhs, rhs, sizes))))
    assert np.allclose(out, 8.0), f"tessera.jax on a GPU array: {out}"
    print("tessera.jax on", gpus[0], "ok")
for k in tessera.kernels():
    print(k["name"], [(i["name"], i["available"] or i["unavailable_reason"]) for i in tessera.implementations(k["name"])])'
