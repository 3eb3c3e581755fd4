#!/usr/bin/env python3
"""Fused linear-cross-entropy peers of linear_cross_entropy on a GPU, timed with CUDA events
(bench/torch_timing.py: first call, warm-up, median) at the same shapes as Tessera's bench:

  - Liger-Kernel's LigerFusedLinearCrossEntropyLoss (Triton, chunked; package liger-kernel)
  - cut-cross-entropy's linear_cross_entropy (Triton, blockwise; package cut-cross-entropy)

Both as tessera-peers/1 (src/harness/report.h) for `tessera report BENCH.json --peers FILE`:
implementation "liger-flce" / "cce", mode "forward" (no grad) and "fused" (loss + backward), dims
B/H/V, plus the peak extra device memory of the fused step. A peer that is not installed (the GPU
machine has no network: scripts/pack_gpu_deps.sh packs both as wheels into .whl/, which
scripts/gpu_check.sh installs) or that fails is listed in "notes" and skipped.

  python3 bench/torch_lce_peers.py [--shapes 8192x4096x128256,...] [--dtype bf16] [--iters 10] --out FILE
"""
import argparse
import json
import sys

import torch

from torch_timing import timed  # bench/torch_timing.py, beside this script


def liger_loss():
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    fn = LigerFusedLinearCrossEntropyLoss()
    return lambda x, w, y: fn(w, x, y)  # Liger takes (lin_weight [V, H], input [B, H], target)


def cce_loss():
    from cut_cross_entropy import linear_cross_entropy
    return lambda x, w, y: linear_cross_entropy(x, w, y)  # (embeddings [B, H], classifier [V, H], targets)


PEERS = (("liger-flce", "Liger-Kernel LigerFusedLinearCrossEntropyLoss", liger_loss),
         ("cce", "cut-cross-entropy linear_cross_entropy", cce_loss))


def time_peer(loss, x, w, y, warmup, iters):
    def fwd():
        with torch.no_grad():
            return loss(x, w, y)

    def fused():
        x.grad = None
        w.grad = None
        out = loss(x, w, y)
        out.backward()
        return out

    res = {"forward": timed(fwd, warmup, iters), "fused": timed(fused, warmup, iters)}
    x.grad = None
    w.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    res["loss"] = float(fused())
    torch.cuda.synchronize()
    res["peak_extra_bytes_fused"] = torch.cuda.max_memory_allocated() - base
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x4096x128256,8192x2304x256000")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    dev = torch.device("cuda")
    doc = {"schema": "tessera-peers/1", "kernel": "linear_cross_entropy", "source": f"PyTorch {torch.__version__}",
           "device": torch.cuda.get_device_name(dev), "dims": ["B", "H", "V"], "rows": [], "notes": []}
    peers = []
    for name, what, make in PEERS:
        try:
            peers.append((name, what, make()))
        except Exception as e:  # not installed, or an incompatible version
            doc["notes"].append(f"{name} ({what}) not run: {type(e).__name__}: {e}")
    for item in a.shapes.split(","):
        B, H, V = (int(v) for v in item.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        x = (torch.rand(B, H, device=dev, generator=g) * 2 - 1).to(dt).requires_grad_(True)
        w = ((torch.rand(V, H, device=dev, generator=g) * 2 - 1) * (3.0 / H ** 0.5)).to(dt).requires_grad_(True)
        y = torch.randint(0, V, (B,), device=dev, generator=g)
        for name, what, loss in peers:
            print(f"{name} B={B} H={H} V={V} {a.dtype} ...", file=sys.stderr)
            try:
                r = time_peer(loss, x, w, y, a.warmup, a.iters)
            except Exception as e:  # out of memory, a Triton error: report, go on
                doc["notes"].append(f"{name} at B={B},H={H},V={V}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                torch.cuda.empty_cache()
                continue
            for mode in ("forward", "fused"):
                t = r[mode]
                doc["rows"].append({"implementation": name, "mode": mode, "B": B, "H": H, "V": V, "dtype": a.dtype,
                                    "median_ms": t["median_ms"], "min_ms": t["min_ms"], "max_ms": t["max_ms"],
                                    "first_call_ms": t["first_ms"]})
            doc["notes"].append(f"{name} at B={B},H={H},V={V}: loss {r['loss']:.4f}, "
                                f"peak extra device memory of the fused step {r['peak_extra_bytes_fused'] / 2**20:.0f} MiB")
        del x, w, y
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc["notes"], indent=2))


if __name__ == "__main__":
    main()
