#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on the GPU, the peer of `tessera bench attention --impl cuda`.

Same problem as the tessera bench (src/kernels/attention/spec.cc): q, k, v [B, S, H, D] uniform in
(-1, 1) (passed to SDPA as [B, H, S, D] views, like FlashAttention callers do), dO of o's shape,
Sq = Sk = S, MHA, optional causal mask. Timed with CUDA events (warm-up, median) per SDPA backend
that accepts the inputs: flash, cudnn, efficient (torch.nn.attention.sdpa_kernel), plus PyTorch's
own choice ("default"). Passes: "forward" (no grad) and "fused" (forward + backward, what tessera's
fused pass computes). TFLOP/s with the tessera cost model: 4·B·H·D·pairs forward, 2.5x that
backward, pairs = S² (or S(S+1)/2 causal).

With --peers-out FILE it also writes tessera-peers/1 rows (src/harness/report.h) for
`tessera report BENCH.json --peers FILE`: implementation "torch-sdpa-<backend>", dims B/S/H/D.

  python3 bench/torch_attention_baseline.py [--shapes 4x4096x16x128,...] [--dtype bf16] [--causal]
                                            [--iters 10] [--out FILE] [--peers-out FILE]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from torch_timing import timed  # bench/torch_timing.py, beside this script


def backends():
    """(name, context manager factory or None) for every SDPA backend this PyTorch can force."""
    out = [("default", None)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # older PyTorch: only its own choice
        return out
    for name, attr in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION")):
        if hasattr(SDPBackend, attr):
            out.append((name, lambda b=getattr(SDPBackend, attr): sdpa_kernel(b)))
    return out


def run_shape(B, S, H, D, dt, causal, warmup, iters):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    mk = lambda: (torch.rand(B, S, H, D, device=dev, generator=g) * 2 - 1).to(dt)
    q, k, v, d_o = mk().requires_grad_(True), mk().requires_grad_(True), mk().requires_grad_(True), mk()
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, D] views, no copies
    pairs = S * (S + 1) / 2 if causal else S * S
    fwd_flop = 4.0 * B * H * D * pairs
    row = {"B": B, "S": S, "H": H, "D": D, "backends": {}}
    for name, ctx in backends():
        def call():
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def fwd():
            with torch.no_grad():
                call()

        def fwd_bwd():
            q.grad = k.grad = v.grad = None
            call().transpose(1, 2).backward(d_o)

        res = {}
        try:
            if ctx is None:
                res["forward"], res["fused"] = timed(fwd, warmup, iters), timed(fwd_bwd, warmup, iters)
            else:
                with ctx():
                    res["forward"], res["fused"] = timed(fwd, warmup, iters), timed(fwd_bwd, warmup, iters)
            res["forward"]["tflops"] = fwd_flop / (res["forward"]["median_ms"] * 1e9)
            res["fused"]["tflops"] = 3.5 * fwd_flop / (res["fused"]["median_ms"] * 1e9)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # backend refuses the inputs
            res = {"error": str(e).splitlines()[0][:200]}
        row["backends"][name] = res
        print(f"torch sdpa {name} B={B} S={S} H={H} D={D}: " +
              (res["error"] if "error" in res else
               f"fwd {res['forward']['median_ms']:.3f} ms ({res['forward']['tflops']:.0f} TFLOP/s), "
               f"fwd+bwd {res['fused']['median_ms']:.3f} ms ({res['fused']['tflops']:.0f} TFLOP/s)"), file=sys.stderr)
    return row


def peer_results(doc):
    rows = []
    suffix = "-causal" if doc["causal"] else ""
    for r in doc["results"]:
        for name, res in r["backends"].items():
            for mode in ("forward", "fused"):
                if mode not in res:
                    continue
                t = res[mode]
                rows.append({"implementation": f"torch-sdpa-{name}{suffix}", "mode": mode, "B": r["B"], "S": r["S"],
                             "H": r["H"], "D": r["D"], "dtype": doc["dtype"], "median_ms": t["median_ms"],
                             "min_ms": t["min_ms"], "max_ms": t["max_ms"], "first_call_ms": t["first_ms"]})
    return {"schema": "tessera-peers/1", "kernel": "attention",
            "source": f"PyTorch {doc['torch']} scaled_dot_product_attention" + (" (causal)" if doc["causal"] else ""),
            "device": doc["device"], "dims": ["B", "S", "H", "D"], "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x4096x16x128", help="BxSxHxD,...")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--peers-out", default="", help="also write tessera-peers/1 JSON for `tessera report --peers`")
    a = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": a.dtype,
           "causal": a.causal, "results": []}
    for item in a.shapes.split(","):
        B, S, H, D = (int(x) for x in item.split("x"))
        doc["results"].append(run_shape(B, S, H, D, dt, a.causal, a.warmup, a.iters))
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
