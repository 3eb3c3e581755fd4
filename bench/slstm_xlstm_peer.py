#!/usr/bin/env python3
"""The `xlstm` package's vanilla PyTorch sLSTM (PyPI `xlstm`, xlstm.blocks.slstm.src.vanilla:
a Python loop over steps) against tessera.torch.slstm, on the CPU, in the same process: forward
and forward + backward, median wall time. The two compute the same math (gate order i, f, z, o;
head-wise recurrent weights); the outputs are compared before timing.

  python3 bench/slstm_xlstm_peer.py [--shape 16,256,4,128] [--iters 3] [--impl cpu] [--torch-threads N] [--out FILE]
"""
import argparse
import json

import numpy as np
import torch

import tessera
import tessera.torch  # noqa: F401 - registers the custom ops
from torch_timing import wall  # bench/, beside this script



def xlstm_call(wx, r, b):
    """h [B, S, NH, DH] from the vanilla loop: x [S, B, 4·NH·DH] (gate-major, then head),
    R [NH, 4·DH, DH] (R[h, g·DH + k, j] = r[g, h, j, k]), b [4·NH·DH] in x's order, states [4, B, NH·DH]."""
    from xlstm.blocks.slstm.src.vanilla import slstm_forward, slstm_pointwise_function_registry

    B, S, _, NH, DH = wx.shape
    x = wx.permute(1, 0, 2, 3, 4).reshape(S, B, 4 * NH * DH)
    R = r.permute(1, 0, 3, 2).reshape(NH, 4 * DH, DH)
    states = torch.zeros(4, B, NH * DH, dtype=wx.dtype)
    states_all, _, _ = slstm_forward(x, states, R, b.reshape(-1), slstm_pointwise_function_registry["slstm"])
    return states_all[0, 1:].reshape(S, B, NH, DH).permute(1, 0, 2, 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="16,256,4,128", help="B,S,NH,DH")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--impl", default="cpu")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch intra-op threads for the peer (0: torch's default; 1 avoids OpenMP barrier stalls on a busy machine)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.torch_threads:
        torch.set_num_threads(a.torch_threads)
    B, S, NH, DH = (int(v) for v in a.shape.split(","))
    g = torch.Generator().manual_seed(0)
    wx = torch.rand(B, S, 4, NH, DH, generator=g) * 2 - 1
    r = (torch.rand(4, NH, DH, DH, generator=g) * 2 - 1) * (0.5 / DH ** 0.5)
    b = (torch.rand(4, NH, DH, generator=g) * 2 - 1) * 0.5
    with torch.no_grad():
        want = tessera.torch.slstm(wx, r, b, implementation=a.impl)
        got = xlstm_call(wx, r, b)
    err = float((got - want).abs().max())
    flops = 8.0 * B * S * NH * DH * DH
    res = {"shape": {"B": B, "S": S, "NH": NH, "DH": DH}, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "max_abs_diff_h": err, "rows": []}

    def fwd_bwd(fn):
        def run():
            p = [t.clone().requires_grad_() for t in (wx, r, b)]
            fn(*p).sum().backward()
        return run

    cases = {
        ("xlstm-vanilla", "forward"): lambda: xlstm_call(wx, r, b),
        ("tessera-" + a.impl, "forward"): lambda: tessera.torch.slstm(wx, r, b, implementation=a.impl),
        ("xlstm-vanilla", "fused"): fwd_bwd(xlstm_call),
        ("tessera-" + a.impl, "fused"): fwd_bwd(lambda w, rr, bb: tessera.torch.slstm(w, rr, bb, implementation=a.impl)),
    }
    for (name, pas), fn in cases.items():
        torch.set_grad_enabled(pas == "fused")
        t = wall(fn, a.warmup, a.iters)
        t.update({"name": name, "pass": pas, "gflops": (flops if pas == "forward" else 3 * flops) / t["median_ms"] / 1e6})
        res["rows"].append(t)
        print(f"{name:16s} {pas:8s} {t['median_ms']:10.1f} ms  {t['gflops']:6.2f} GFLOP/s (recurrent products)", flush=True)
    for pas in ("forward", "fused"):
        peer = next(x for x in res["rows"] if x["name"] == "xlstm-vanilla" and x["pass"] == pas)
        ours = next(x for x in res["rows"] if x["name"] != "xlstm-vanilla" and x["pass"] == pas)
        print(f"{pas}: tessera {peer['median_ms'] / ours['median_ms']:.1f}x faster than xlstm vanilla")
    print(f"max |h_xlstm - h_tessera| = {err:.2e}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
