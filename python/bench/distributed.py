"""Vocab-parallel linear cross-entropy on torch.distributed: time per training step (loss forward
+ backward) and bytes communicated per token at 1, 2 and 4 ranks, against an all-gather-the-logits
baseline (each rank computes its slice's logits with torch, all-gathers them, and runs
F.cross_entropy on the full [B, V] logits). gloo on CPU tensors; with --backend nccl and CUDA
tensors the same script measures GPUs.

    python python/bench/distributed.py --shape 2048,1024,32768 --ranks 1,2,4 --reps 3 [--json OUT]

Communication per token (f32, ring all-reduce moving 2(R−1)/R of the buffer per rank):
Tessera 1 float (the max) + 3 floats (Σexp, label logit, Σσz) forward, H floats (dx) backward;
the baseline all-gathers (R−1)/R·V floats of logits forward and all-reduces H floats of dx.
The CPU cores are shared by the ranks: each rank gets cores/R threads.
"""
import argparse
import datetime
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
import torch.multiprocessing as mp


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problem(B, H, V):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, generator=g), torch.randn(V, H, generator=g) * 0.02,
            torch.randint(0, V, (B,), generator=g))


def _slice(V, R, r):
    base, extra = divmod(V, R)
    start = r * base + min(r, extra)
    return start, base + (1 if r < extra else 0)


def _median_ms(step, reps):
    step()
    ts = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        dist.barrier()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def _worker(rank, R, port, args, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // R))
    dist.init_process_group(args.backend, rank=rank, world_size=R, timeout=datetime.timedelta(seconds=600))
    import tessera.torch as tt
    B, H, V = args.shape
    x, w, labels = _problem(B, H, V)
    start, n = _slice(V, R, rank)
    w_local = w[start:start + n].contiguous()

    def tessera_step():
        X, W = x.clone().requires_grad_(), w_local.clone().requires_grad_()
        tt.linear_cross_entropy(X, W, labels, vocab_start=start, process_group=dist.group.WORLD).backward()

    def gather_logits_step():
        X, W = x.clone().requires_grad_(), w_local.clone().requires_grad_()
        parts = dist_fn.all_gather(X @ W.t()) if R > 1 else [X @ W.t()]
        torch.nn.functional.cross_entropy(torch.cat(parts, dim=1), labels).backward()

    row = {"ranks": R, "B": B, "H": H, "V": V,
           "tessera_ms": _median_ms(tessera_step, args.reps),
           "gather_logits_ms": _median_ms(gather_logits_step, args.reps),
           "tessera_bytes_per_token": 0 if R == 1 else 4 * (4 + H) * 2 * (R - 1) / R,
           "gather_logits_bytes_per_token": 0 if R == 1 else 4 * (V * (R - 1) / R + H * 2 * (R - 1) / R)}
    if rank == 0:
        results.put(row)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="2048,1024,32768", help="B,H,V")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backend", default="gloo")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    args.shape = tuple(int(v) for v in args.shape.split(","))
    ctx = mp.get_context("spawn")
    rows = []
    for R in (int(r) for r in args.ranks.split(",")):
        print(f"{R} rank(s) ...", flush=True)
        q = ctx.SimpleQueue()
        mp.start_processes(_worker, args=(R, _free_port(), args, q), nprocs=R, start_method="spawn")
        row = q.get()
        rows.append(row)
        print(f"  tessera {row['tessera_ms']:.1f} ms, gather-logits {row['gather_logits_ms']:.1f} ms; bytes/token "
              f"{row['tessera_bytes_per_token']:.0f} vs {row['gather_logits_bytes_per_token']:.0f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
