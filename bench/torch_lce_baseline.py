#!/usr/bin/env python3
"""PyTorch eager baseline for linear_cross_entropy: logits = x @ w.T, F.cross_entropy on f32
logits (mean), then backward. CUDA-event timing (warm-up, median), peak extra memory from
torch.cuda.max_memory_allocated. Prints one JSON document (or writes --out).

With --peers-out FILE it also writes the timings as peer results (schema "tessera-peers/1",
documented in src/harness/report.h) that `tessera report BENCH.json --peers FILE` draws beside
Tessera's own rows: implementation "torch-eager", mode "forward" (no grad) and "fused" (loss and
backward in one step, what Tessera's fused pass computes), the dims B/H/V, median/min/max ms.

  python3 bench/torch_lce_baseline.py [--shapes 8192x4096x128256,...] [--dtype bf16] [--iters 10]
                                      [--out FILE] [--peers-out FILE]
"""
import argparse
import json
import sys

import torch

from torch_timing import timed  # bench/torch_timing.py, beside this script
import torch.nn.functional as F


def peer_results(doc):
    """The run as tessera-peers/1 rows: one per shape and pass that was timed."""
    rows = []
    for r in doc["results"]:
        for key, mode in (("forward", "forward"), ("forward_backward", "fused")):
            if key not in r:
                continue  # out of memory: nothing timed
            t = r[key]
            rows.append({"implementation": "torch-eager", "mode": mode, "B": r["B"], "H": r["H"], "V": r["V"],
                         "dtype": doc["dtype"], "median_ms": t["median_ms"], "min_ms": t["min_ms"],
                         "max_ms": t["max_ms"], "first_call_ms": t["first_ms"]})
    return {"schema": "tessera-peers/1", "kernel": "linear_cross_entropy",
            "source": f"PyTorch {doc['torch']} {doc['variant']}", "device": doc["device"],
            "dims": ["B", "H", "V"], "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="8192x4096x128256,8192x2304x256000")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--peers-out", default="", help="also write tessera-peers/1 JSON for `tessera report --peers`")
    a = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    dev = torch.device("cuda")
    doc = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__, "dtype": a.dtype,
           "variant": "eager: logits = x @ w.T; F.cross_entropy(logits.float(), labels); backward",
           "results": []}
    for item in a.shapes.split(","):
        B, H, V = (int(v) for v in item.split("x"))
        print(f"torch shape B={B} H={H} V={V} {a.dtype} ...", file=sys.stderr)
        g = torch.Generator(device=dev).manual_seed(0)
        x = (torch.rand(B, H, device=dev, generator=g) * 2 - 1).to(dt).requires_grad_(True)
        w = ((torch.rand(V, H, device=dev, generator=g) * 2 - 1) * (3.0 / H ** 0.5)).to(dt).requires_grad_(True)
        labels = torch.randint(0, V, (B,), device=dev, generator=g)

        def fwd():
            with torch.no_grad():
                return F.cross_entropy((x @ w.T).float(), labels)

        def fwd_bwd():
            x.grad = None
            w.grad = None
            loss = F.cross_entropy((x @ w.T).float(), labels)
            loss.backward()
            return loss

        row = {"B": B, "H": H, "V": V}
        try:
            row["forward"] = timed(fwd, a.warmup, a.iters)
            row["forward_backward"] = timed(fwd_bwd, a.warmup, a.iters)
            x.grad = None
            w.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            loss = fwd_bwd()
            torch.cuda.synchronize()
            row["peak_extra_bytes_forward_backward"] = torch.cuda.max_memory_allocated() - base
            row["loss"] = float(loss)
            flop = 2.0 * B * H * V
            row["forward_backward_tflops"] = 3 * flop / (row["forward_backward"]["median_ms"] * 1e9)
        except torch.cuda.OutOfMemoryError as e:  # report, do not fail the whole run
            row["error"] = f"out of memory: {e}"
        doc["results"].append(row)
        del x, w, labels
        torch.cuda.empty_cache()
    text = json.dumps(doc, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if a.peers_out:
        with open(a.peers_out, "w") as f:
            f.write(json.dumps(peer_results(doc), indent=2) + "\n")


if __name__ == "__main__":
    main()
