#!/usr/bin/env python3
"""PyTorch CPU peers for grouped_matmul, forward (out = lhs[rows of g] · rhs[g]) at the shapes
`tessera bench grouped_matmul` runs: torch._grouped_mm, a loop of torch.mm per non-empty group,
and the dense floor (one torch.mm of every row against rhs[0]), in f32 and bf16 (oneDNN/MKL
underneath). Wall-clock medians after warm-up; GFLOP/s at 2·M·K·N, the count tessera's bench uses.
Run it in the same minutes as `tessera roofline` and the bench, with the same thread count.

  python3 bench/torch_gmm_cpu.py [--shapes 4096x1024x2048x8,4096x1024x2048x64]
                                 [--routing balanced] [--dtype f32,bf16] [--iters 7] [--threads N]
"""
import argparse
import json

import torch

from torch_gmm_baseline import route  # the bench's group sizes (bench/, beside this script)
from torch_timing import wall

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def peers(M, K, N, G, routing, dt):
    torch.manual_seed(0)
    lhs, rhs = torch.rand(M, K, dtype=dt) * 2 - 1, torch.rand(G, K, N, dtype=dt) * 2 - 1
    sizes = route(M, G, routing)
    offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    out = torch.empty(M, N, dtype=dt)

    def loop():
        start = 0
        for g, rows in enumerate(sizes):
            if rows:
                torch.mm(lhs[start:start + rows], rhs[g], out=out[start:start + rows])
            start += rows

    return {"torch._grouped_mm": lambda: torch._grouped_mm(lhs, rhs, offs=offs),
            "torch.mm per group": loop,
            "dense torch.mm (floor)": lambda: torch.mm(lhs, rhs[0], out=out)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4096x1024x2048x8,4096x1024x2048x64", help="MxKxNxG, comma-separated")
    ap.add_argument("--routing", default="balanced")
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    for shape in a.shapes.split(","):
        M, K, N, G = (int(v) for v in shape.split("x"))
        for dname in a.dtype.split(","):
            for name, fn in peers(M, K, N, G, a.routing, DTYPES[dname]).items():
                try:
                    ms = wall(fn, 1, a.iters)["median_ms"]  # oneDNN picks its kernels on the first calls
                except RuntimeError as e:  # an op this build does not have on CPU
                    rows.append({"peer": name, "shape": shape, "dtype": dname, "error": str(e).splitlines()[0]})
                    continue
                rows.append({"peer": name, "shape": shape, "dtype": dname, "ms": round(ms, 3),
                             "gflops": round(2 * M * K * N / ms / 1e6, 1)})
                print(f"{name:24s} {shape:20s} {dname:5s} {ms:9.2f} ms {rows[-1]['gflops']:8.1f} GFLOP/s", flush=True)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "routing": a.routing,
                      "rows": rows}))


if __name__ == "__main__":
    main()
