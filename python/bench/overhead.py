"""What a Python call costs over the C++ call: the forward of linear_cross_entropy (cpu) timed from
C++ (`tessera bench`, its median) and from NumPy, PyTorch and JAX (median of --reps calls), at a
small shape and at a tiny one where the kernel's own time is negligible.

    python python/bench/overhead.py --cli build/release/bin/tessera
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import numpy as np


def median_ms(fn, reps):
    fn()
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def cpp_ms(cli, B, H, V):  # w as [V, H] (lm_head.weight), like the Python calls below
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.json")
        subprocess.run([cli, "bench", "linear_cross_entropy", "--impl", "cpu", "--shape", f"{B},{H},{V}",
                        "--dtype", "f32", "--pass", "forward", "--layout", "vh", "--json", out], check=True, capture_output=True)
        rows = json.load(open(out))["rows"]
    for r in rows:
        if r.get("implementation") == "cpu" and r.get("pass", r.get("mode")) in ("forward", "fwd"):
            return r["median_ms"] if "median_ms" in r else r["median_s"] * 1e3
    raise RuntimeError(f"no cpu forward row in {rows}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", default="build/release/bin/tessera")
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    import jax
    import torch

    import tessera
    import tessera.jax as tj
    import tessera.torch as tt
    for B, H, V in [(256, 512, 8192), (4, 16, 64)]:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((B, H)).astype(np.float32)
        w = (rng.standard_normal((V, H)) * 0.05).astype(np.float32)
        y = rng.integers(0, V, B)
        xt, wt, yt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(y)
        xj, wj, yj = jax.numpy.asarray(x), jax.numpy.asarray(w), jax.numpy.asarray(y.astype(np.int32))
        fj = jax.jit(lambda x, w, y: tj.linear_cross_entropy(x, w, y, implementation="cpu"))
        rows = {
            "C++ (tessera bench, median)": cpp_ms(a.cli, B, H, V),
            "NumPy  tessera.linear_cross_entropy": median_ms(lambda: tessera.linear_cross_entropy(x, w, y, implementation="cpu"), a.reps),
            "torch  tessera.torch (no grad)": median_ms(lambda: tt.linear_cross_entropy(xt, wt, yt, implementation="cpu"), a.reps),
            "JAX    jit(tessera.jax)": median_ms(lambda: fj(xj, wj, yj).block_until_ready(), a.reps),
        }
        base = rows["C++ (tessera bench, median)"]
        print(f"B={B} H={H} V={V} f32 forward, cpu implementation")
        for k, v in rows.items():
            print(f"  {k:38} {v:9.3f} ms   {'' if k.startswith('C++') else f'{(v - base) * 1e3:+8.0f} us vs C++'}")


if __name__ == "__main__":
    main()
