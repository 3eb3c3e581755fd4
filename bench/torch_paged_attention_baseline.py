#!/usr/bin/env python3
"""Tessera's paged_attention against PyTorch's CPU scaled_dot_product_attention on the gathered
tensors, timed in one run.

The batch is the bench's: N sequences of kv_len S (causal), the first --prefill of them
prefilling Q new tokens, the others decoding one; H query heads, H/gqa kv heads, head dim D,
pages of --page-size slots in a shuffled order. PyTorch's time includes the gather (index_select
of each sequence's pages into contiguous k, v) and SDPA (decode rows batched, enable_gqa; each
prefill sequence on its own with a bottom-right causal mask). Then `tessera bench
paged_attention` (cpu and, with --compare, the gather+attention baseline) runs as a subprocess on
the same shape. Medians; CPU time per call is printed too (steadier on a shared machine).

  python3 bench/torch_paged_attention_baseline.py [--tessera build/release/bin/tessera]
      [--shape 32,4096,1,32,128] [--prefill 0] [--gqa 4] [--page-size 16] [--dtype bf16]
      [--rounds 5] [--threads N] [--json out.json]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    sys.exit("needs PyTorch: pip install torch --index-url https://download.pytorch.org/whl/cpu")

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def make(N, S, Q, H, D, prefill, gqa, ps, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv, pages = H // gqa, -(-S // ps)
    P = N * pages
    k = (torch.rand(P, ps, Hkv, D, generator=g) * 2 - 1).to(dtype)
    v = (torch.rand(P, ps, Hkv, D, generator=g) * 2 - 1).to(dtype)
    pt = torch.randperm(P, generator=g).reshape(N, pages)
    q_lens = [Q if s < prefill else 1 for s in range(N)]
    q = (torch.rand(sum(q_lens), H, D, generator=g) * 2 - 1).to(dtype)
    return q, k, v, pt, q_lens


def torch_step(q, k, v, pt, q_lens, S):
    N, Hkv, D = pt.shape[0], k.shape[2], k.shape[3]
    gk = k.index_select(0, pt.reshape(-1)).reshape(N, -1, Hkv, D)[:, :S].transpose(1, 2)  # [N, Hkv, S, D]
    gv = v.index_select(0, pt.reshape(-1)).reshape(N, -1, Hkv, D)[:, :S].transpose(1, 2)
    dec = [s for s, n in enumerate(q_lens) if n == 1]
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    outs = []
    if dec:
        qd = torch.stack([q[starts[s]] for s in dec]).unsqueeze(2)  # [n, H, 1, D]
        outs.append(F.scaled_dot_product_attention(qd, gk[dec], gv[dec], enable_gqa=True))
    for s, n in enumerate(q_lens):
        if n == 1:
            continue
        qs = q[starts[s]:starts[s + 1]].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        mask = torch.ones(n, S, dtype=torch.bool).tril(S - n)  # bottom-right causal
        outs.append(F.scaled_dot_product_attention(qs, gk[s:s + 1], gv[s:s + 1], attn_mask=mask, enable_gqa=True))
    return outs


def timed(fn, rounds):
    fn()
    wall, cpu = [], []
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/release/bin/tessera")
    ap.add_argument("--shape", default="32,4096,1,32,128", help="N,S,Q,H,D")
    ap.add_argument("--prefill", type=int, default=0)
    ap.add_argument("--gqa", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    N, S, Q, H, D = (int(x) for x in a.shape.split(","))
    if a.threads:
        torch.set_num_threads(a.threads)
    q, k, v, pt, q_lens = make(N, S, Q, H, D, a.prefill, a.gqa, a.page_size, DTYPES[a.dtype])
    with torch.no_grad():
        wall, cpu = timed(lambda: torch_step(q, k, v, pt, q_lens, S), a.rounds)
    cache_gb = N * S * (H // a.gqa) * 2 * D * q.element_size() / 1e9
    print(f"torch gather+sdpa  {a.shape} prefill={a.prefill} {a.dtype}: {wall:.1f} ms wall, {cpu:.1f} ms cpu, "
          f"{cache_gb / (wall / 1e3):.2f} GB/s of needed cache")
    cmd = [a.tessera, "bench", "paged_attention", "--shape", a.shape, "--dtype", a.dtype, "--compare", "--no-gemm",
           "--prefill", str(a.prefill), "--gqa", str(a.gqa), "--page-size", str(a.page_size), "--impl", "cpu"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    if a.json:
        cmd += ["--json", a.json]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    if a.json:
        doc = json.load(open(a.json))
        doc.setdefault("peers", []).append({"name": "torch gather+sdpa", "median_ms": wall, "cpu_ms": cpu})
        json.dump(doc, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
