#!/usr/bin/env python3
"""PyTorch baselines for grouped_matmul on a GPU: torch._grouped_mm (PyTorch's grouped GEMM, bf16
on sm_90) and a loop of torch.mm per group (the cuBLAS loop), forward only, at the shapes Tessera
benchmarks (M rows sorted by group, balanced or skewed routing: one group with 70 % of the rows,
the last two empty). CUDA-event timing (warm-up, median). Prints one JSON document (or --out) and,
with --peers-out, tessera-peers/1 rows for `tessera report BENCH.json --peers FILE`.

  python3 bench/torch_gmm_baseline.py [--shapes 65536x2048x1536x128] [--routing balanced,skewed]
                                      [--dtype bf16] [--iters 10] [--out FILE] [--peers-out FILE]
"""
import argparse
import json
import sys

import torch

from torch_timing import timed  # bench/torch_timing.py, beside this script


def route(M, G, routing):
    """Group sizes as tessera's bench makes them (src/kernels/grouped_matmul/spec.cc, route())."""
    if routing == "balanced":
        return [M * (g + 1) // G - M * g // G for g in range(G)]
    big = M * 7 // 10
    rest = M - big
    others = G - 3 if G >= 4 else G - 1
    sizes = [0] * G
    if others == 0:
        sizes[0] = M
        return sizes
    sizes[0] = big
    for i in range(others):
        sizes[1 + i] = rest * (i + 1) // others - rest * i // others
    return sizes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="65536x2048x1536x128", help="MxKxNxG, comma-separated")
    ap.add_argument("--routing", default="balanced,skewed")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--peers-out", default="")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_gmm_baseline: no CUDA device")
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    doc = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "dtype": a.dtype, "results": []}
    rows = []
    for shape in a.shapes.split(","):
        M, K, N, G = (int(v) for v in shape.split("x"))
        for routing in a.routing.split(","):
            sizes = route(M, G, routing)
            lhs = torch.randn(M, K, device="cuda", dtype=dt)
            rhs = torch.randn(G, K, N, device="cuda", dtype=dt)
            offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
            r = {"M": M, "K": K, "N": N, "G": G, "routing": routing}

            def loop():
                out, start = torch.empty(M, N, device="cuda", dtype=dt), 0
                for g, n in enumerate(sizes):
                    if n:
                        torch.mm(lhs[start:start + n], rhs[g], out=out[start:start + n])
                    start += n
                return out

            r["cublas_loop"] = timed(loop, a.warmup, a.iters)
            if hasattr(torch, "_grouped_mm") and dt == torch.bfloat16:
                # _grouped_mm wants the second operand's last dim contiguous in a [G, N, K]^T layout.
                rhs_t = rhs.transpose(-2, -1).contiguous().transpose(-2, -1)
                try:
                    r["torch_grouped_mm"] = timed(lambda: torch._grouped_mm(lhs, rhs_t, offs=offs), a.warmup, a.iters)
                except RuntimeError as e:
                    r["torch_grouped_mm_error"] = str(e).splitlines()[0]
            doc["results"].append(r)
            for key in ("cublas_loop", "torch_grouped_mm"):
                if key in r:
                    t = r[key]
                    rows.append({"implementation": key.replace("_", "-"), "mode": "forward", "M": M, "K": K,
                                 "N": N, "G": G, "dtype": a.dtype, "median_ms": t["median_ms"], "min_ms": t["min_ms"],
                                 "max_ms": t["max_ms"], "first_call_ms": t["first_ms"]})
            del lhs, rhs
    text = json.dumps(doc, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    if a.peers_out:
        with open(a.peers_out, "w") as f:
            json.dump({"schema": "tessera-peers/1", "kernel": "grouped_matmul",
                       "source": f"PyTorch {doc['torch']}", "device": doc["device"],
                       "dims": ["M", "K", "N", "G"], "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
