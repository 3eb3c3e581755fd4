#!/usr/bin/env python3
"""mlstm against its peer, in one run: PyPI `mlstm_kernels`' native PyTorch chunkwise
implementation (`chunkwise--native_autograd`) at chunk 64 and 128, and tessera.torch.mlstm (cpu),
forward and forward + backward, median of --repeats after a warm-up, f32 on the CPU.

    python bench/mlstm_peer.py [--B 1 --NH 4 --S 2048 --DHQK 256 --DHV 256] [--repeats 5] [--threads N]

Prints one line per (implementation, chunk, pass) with the median in ms and the ratio to the
peer's best chunk size. Needs torch and (for the peer rows) `pip install mlstm_kernels einops`.
"""
import argparse
import statistics
import time

import torch


def timed(fn, repeats):
    fn()  # warm-up (first call)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peer_kernel():
    try:
        from mlstm_kernels.torch import get_mlstm_kernel
        return get_mlstm_kernel("chunkwise--native_autograd")
    except Exception as e:  # noqa: BLE001 - report why the peer rows are missing
        print(f"peer: mlstm_kernels unavailable ({type(e).__name__}: {e})")
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for d, v in (("B", 1), ("NH", 4), ("S", 2048), ("DHQK", 256), ("DHV", 256)):
        ap.add_argument("--" + d, type=int, default=v)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    shape = (a.B, a.NH, a.S)
    q = torch.randn(*shape, a.DHQK, generator=g)
    k = torch.randn(*shape, a.DHQK, generator=g)
    v = torch.randn(*shape, a.DHV, generator=g)
    i = torch.randn(*shape, generator=g)
    f = 3.0 + torch.randn(*shape, generator=g)
    rows = []

    def both(name, chunk, call):
        def fwd():
            with torch.no_grad():
                call(q, k, v, i, f)

        def fwd_bwd():
            xs = [t.clone().requires_grad_() for t in (q, k, v, i, f)]
            call(*xs).sum().backward()

        rows.append((name, chunk, "forward", timed(fwd, a.repeats)))
        rows.append((name, chunk, "forward+backward", timed(fwd_bwd, a.repeats)))

    peer = peer_kernel()
    if peer is not None:
        for chunk in (64, 128):
            both("mlstm_kernels chunkwise--native_autograd", chunk,
                 lambda *x, c=chunk: peer(*x, chunk_size=c, return_last_states=False))
    import tessera.torch as tt
    for chunk in (64, 128):
        both("tessera.torch.mlstm cpu", chunk, lambda *x, c=chunk: tt.mlstm(*x, chunk_size=c, implementation="cpu"))
    best = {p: min((ms for n, _, pp, ms in rows if pp == p and n.startswith("mlstm_kernels")), default=None)
            for p in ("forward", "forward+backward")}
    print(f"B={a.B} NH={a.NH} S={a.S} DHQK={a.DHQK} DHV={a.DHV} f32, torch threads {torch.get_num_threads()}")
    for name, chunk, p, ms in rows:
        ratio = f"  x{best[p] / ms:.2f} vs the peer's best" if best[p] else ""
        print(f"{name:44s} chunk {chunk:4d} {p:17s} {ms:9.1f} ms{ratio}")


if __name__ == "__main__":
    main()
