#!/usr/bin/env python3
"""PyTorch CPU peers for issue #24's table, timed in the same minutes as `tessera bench`:
linear_cross_entropy's math (the materialized loss F.cross_entropy(x @ w.T) and
F.linear_cross_entropy, forward + backward) and attention's (scaled_dot_product_attention,
forward without grad and forward + backward), in f32 and bf16. Wall-clock medians after one
warm-up. grouped_matmul's peers are bench/torch_gmm_cpu.py.

  python3 bench/torch_cpu_peers.py [--lce 2048x1024x32768] [--attention 1x2048x8x128]
                                   [--dtype f32,bf16] [--iters 3] [--threads 2] [--out FILE]

Prints one JSON object {"what dtype": median ms, ...} (and writes it to --out).
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_timing import wall  # bench/torch_timing.py, beside this script

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def median_ms(fn, iters):
    """Median wall-clock ms of `iters` calls after one untimed call (torch_timing.wall)."""
    return round(wall(fn, 0, iters)["median_ms"], 1)


def lce(B, H, V, dt, iters, g):
    x = (torch.rand(B, H, generator=g) * 2 - 1).to(dt).requires_grad_()
    w = ((torch.rand(V, H, generator=g) * 2 - 1) * 0.05).to(dt).requires_grad_()
    y = torch.randint(0, V, (B,), generator=g)

    def step(loss_fn):
        def run():
            x.grad = w.grad = None
            loss_fn().backward()
        return run
    return {"lce materialized fwd+bwd": median_ms(step(lambda: F.cross_entropy((x @ w.T).float(), y)), iters),
            "lce F.linear_cross_entropy fwd+bwd": median_ms(step(lambda: F.linear_cross_entropy(x, w, y)), iters)}


def sdpa(B, S, Hh, D, dt, iters, g):
    q, k, v = ((torch.rand(B, Hh, S, D, generator=g) * 2 - 1).to(dt).requires_grad_() for _ in range(3))

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        F.scaled_dot_product_attention(q, k, v).backward(torch.ones_like(q))
    return {"sdpa fwd": median_ms(fwd, iters), "sdpa fwd+bwd": median_ms(fwd_bwd, iters)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lce", default="2048x1024x32768", help="BxHxV")
    ap.add_argument("--attention", default="1x2048x8x128", help="BxSxHxD (q, k, v as [B, H, S, D])")
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    out = {"torch": torch.__version__, "threads": a.threads}
    for name in a.dtype.split(","):
        dt = DTYPES[name]
        for k, ms in lce(*map(int, a.lce.split("x")), dt, a.iters, g).items():
            out[f"{k} {name}"] = ms
        for k, ms in sdpa(*map(int, a.attention.split("x")), dt, a.iters, g).items():
            out[f"{k} {name}"] = ms
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
