"""The host's share of a decode step: `--layers` paged_attention calls from tessera.torch, one per
layer (one shared cache: the kernels' work is the same, the calls are what is timed), as a server
makes them each step. Prints and writes (--out) the wall time per call, and on CUDA the kernels'
own device time per call (torch.profiler): when the wall time is the larger, the host sets the
pace (docs/GPU.md "Host cost per call").

    PYTHONPATH=build/gpu-pkg python3 bench/decode_step_overhead.py --device cuda --out decode.json
"""
import argparse
import json
import statistics
import time

import torch

import tessera.torch as tt

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def problem(a, dev):
    """q [N, Hq, D] (one new token a sequence), caches [P, page, Hkv, D] and the host index arrays
    (page table, lengths and cu_q_lens in host memory, as the kernels read them)."""
    g = torch.Generator().manual_seed(0)
    per_seq = -(-a.kv_len // a.page)
    pages = a.seqs * per_seq
    dt = DTYPES[a.dtype]
    k = torch.randn(pages, a.page, a.hkv, a.d, generator=g).to(dev, dt)
    v = torch.randn(pages, a.page, a.hkv, a.d, generator=g).to(dev, dt)
    q = torch.randn(a.seqs, a.hq, a.d, generator=g).to(dev, dt)
    table = torch.randperm(pages, generator=g).to(torch.int32).view(a.seqs, per_seq)
    lens = torch.full((a.seqs,), a.kv_len, dtype=torch.int32)
    cu = torch.arange(a.seqs + 1, dtype=torch.int32)
    return q, k, v, table, lens, cu


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def step(args, layers):
    out = None
    for _ in range(layers):
        out = tt.paged_attention(*args, causal=True)
    return out


def device_us_per_call(args, layers, dev):
    """The kernels' device time of one step over its calls (CUDA kernel events of the profiler;
    memory copies and sets left out), and how many kernels it saw: None when it saw fewer than one
    a call (a profiler that records nothing must not read as a host-bound step)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(args, layers)
        sync(dev)
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA
               and not e.key.startswith("Memcpy") and not e.key.startswith("Memset")]
    count = sum(e.count for e in kernels)
    if count < layers:
        return None, count
    return sum(e.self_device_time_total for e in kernels) / layers, count


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--kv-len", type=int, default=1024)
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out")
    a = ap.parse_args()
    dev = torch.device(a.device)
    args = problem(a, dev)
    step(args, a.layers)   # warm-up: first-call work (module load, tuning lookups) is not a step's
    sync(dev)
    walls = []
    for i in range(a.steps):
        t0 = time.perf_counter()
        step(args, a.layers)
        sync(dev)
        walls.append((time.perf_counter() - t0) * 1e6 / a.layers)
        print(f"step {i + 1}/{a.steps}: {walls[-1]:.1f} us per call", flush=True)
    row = {"device": str(dev), "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "layers": a.layers, "seqs": a.seqs, "kv_len": a.kv_len, "hq": a.hq, "hkv": a.hkv, "d": a.d,
           "page": a.page, "dtype": a.dtype, "wall_us_per_call": statistics.median(walls)}
    ok = True
    if dev.type == "cuda":
        row["device_us_per_call"], row["kernels_seen"] = device_us_per_call(args, a.layers, dev)
        ok = row["device_us_per_call"] is not None
        row["host_bound"] = row["wall_us_per_call"] > 1.2 * row["device_us_per_call"] if ok else None
    print(json.dumps(row, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(row, f, indent=2)
    if not ok:
        print(f"decode_step_overhead: the profiler saw {row['kernels_seen']} kernels for {a.layers} calls: "
              "no device time", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
