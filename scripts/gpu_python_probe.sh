#!/usr/bin/env bash
# Where does the GPU build's Python package crash? (python/tests/test_cuda.py died with SIGSEGV in
# its first case on the H200, on the CPU tensors of the comparison, inside _ext.outputs.) Each probe
# is a fresh python3 with one more thing done before the same _ext.outputs call that died; the
# first probe that crashes is run again under cuda-gdb for a native backtrace (the package is built
# with -g by gpu_python_package.sh). If no probe crashes, the first test_cuda.py case is run, and
# under cuda-gdb if it crashes. Used by gpu_check.sh's test stage; its log is the finding.
#   scripts/gpu_python_probe.sh PKG_DIR      (PKG_DIR: gpu_python_package.sh's OUT_DIR)
# Exit: 0 nothing crashed (a Python exception is printed but is not a crash: pytest reports those),
#       1 something crashed (killed by a signal; the backtrace is in the output), 2 usage.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] && [ -d "$1/tessera" ] || { echo "usage: gpu_python_probe.sh PKG_DIR (with PKG_DIR/tessera)" >&2; exit 2; }
pkg=$(cd "$1" && pwd)
export PYTHONPATH="$pkg:$root/python/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

echo "== environment"
python3 -VV
python3 -c 'import nanobind; print("nanobind", nanobind.__version__)' 2>&1
python3 -c 'import torch; print("torch", torch.__version__, torch.__file__)' 2>&1
c++ --version 2>&1 | head -1
so=$(readlink -f "$pkg"/tessera/_ext*.so)
echo "extension: $so"
ldd "$so" 2>&1
lib=$(ldd "$so" | awk '/libtessera\.so/ {print $3}')
[ -n "$lib" ] && { echo "libtessera: $lib"; ls -la "$(dirname "$lib")"; }
echo "NEEDED (one shared libstdc++ for the process, cmake/SharedLibstdcxx.cmake):"
readelf -d "$so" ${lib:+"$lib"} 2>&1 | grep NEEDED

# The _ext.outputs call of test_cuda.py's first case (linear_cross_entropy, fused), after the steps
# that PROBE_STEPS names: torch (import torch), impls (tessera.implementations), tensors (the case's
# CPU-tensor run through tessera.torch).
read -r -d '' program << 'EOF'
import faulthandler, os, sys
faulthandler.enable()
steps = os.environ.get("PROBE_STEPS", "").split(",")
if "torch" in steps:
    import torch
import tessera
from tessera import _ext
print("tessera from", tessera.__file__, flush=True)
if "impls" in steps:
    print([(i["name"], i["available"]) for i in tessera.implementations("linear_cross_entropy")], flush=True)
metas = {"x": ("f32", [24, 32], []), "w": ("f32", [80, 32], []), "labels": ("i64", [24], []), "grad_loss": ("f32", [], [])}
print("outputs:", _ext.outputs("linear_cross_entropy", "fused", metas, {}), flush=True)
if "tensors" in steps:
    import numpy as np, torch
    import tessera.torch as tt
    import reference as ref
    x, w, y = ref.problem(seed=5)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    loss = tt.linear_cross_entropy(tx, tw, torch.from_numpy(y))
    loss.backward()
    print("cpu tensors: loss", float(loss.detach()), "|dx|", float(tx.grad.norm()), flush=True)
print("probe done", flush=True)
EOF

backtrace() {  # CMD...: under cuda-gdb, the backtrace of every thread at the fault
  if ! command -v cuda-gdb > /dev/null 2>&1; then echo "(cuda-gdb not found: no backtrace)"; return; fi
  timeout -k 5 150 cuda-gdb -q -batch -ex 'set pagination off' -ex 'set confirm off' \
    -ex 'handle SIGPIPE nostop noprint' -ex run -ex bt -ex 'info registers rip' -ex 'x/6i $pc-12' \
    -ex 'thread apply all bt 12' -ex 'info sharedlibrary' --args "$@" 2>&1 | grep -v '^\[New Thread\|^\[Thread .* exited'
}

crashed=0
for steps in "" impls torch torch,impls torch,impls,tensors; do
  echo; echo "== probe PROBE_STEPS=${steps:-(none)}"
  PROBE_STEPS=$steps timeout -k 5 60 python3 -c "$program" 2>&1
  rc=$?
  echo "== probe PROBE_STEPS=${steps:-(none)}: exit $rc"
  if [ $rc -ge 128 ] && [ $crashed = 0 ]; then  # a signal (124: the probe's timeout, not a crash)
    crashed=1
    echo; echo "== the same under cuda-gdb"
    PROBE_STEPS=$steps backtrace python3 -c "$program"
    echo; echo "== the same with TESSERA_CUDA_MODULE=/nonexistent (no CUDA module)"
    PROBE_STEPS=$steps TESSERA_CUDA_MODULE=/nonexistent timeout -k 5 60 python3 -c "$program" 2>&1
    echo "== exit $?"
  fi
done

echo; echo "== test_cuda.py, first case"
first=(python3 -X faulthandler -m pytest -x -q -p no:cacheprovider "$root/python/tests/test_cuda.py" -k "match_cpu_tensors and lce")
timeout -k 5 120 "${first[@]}" 2>&1
rc=$?
echo "== test_cuda.py first case: exit $rc"
if [ $rc -ge 128 ]; then
  crashed=1
  echo; echo "== the same under cuda-gdb"
  backtrace "${first[@]}"
fi
exit $crashed
