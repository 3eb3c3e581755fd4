#!/usr/bin/env python3
"""Tessera's attention against PyTorch's CPU scaled_dot_product_attention, timed in one run.

For each shape and mask the rounds alternate: PyTorch SDPA (forward without grad, then forward +
backward), then `tessera bench attention` (the cpu implementation, the BLAS-materialized
baseline with --compare, and the sgemm floor) as a subprocess. Medians over all rounds are
reported, with the useful GFLOP/s of the issue's cost model (forward 4·B·H·D·pairs, fused 3.5×
that; pairs = S² or S(S+1)/2 causal) and the fraction of the sgemm rate measured in the same
run. CPU time per call is printed too: on a shared machine it is the steadier number.

Writes, under --out-dir: tessera_<mask>.json (the bench document), torch_sdpa_<mask>.json
(schema "tessera-peers/1", drawn by `tessera report tessera_<mask>.json --peers
torch_sdpa_<mask>.json`) and summary.json / summary.md (the table).

  python3 bench/torch_sdpa_baseline.py [--tessera build/release/bin/tessera]
      [--shapes 1,2048,8,128] [--dtype f32] [--masks full,causal] [--rounds 2] [--threads N]
      [--out-dir attention-vs-torch]

Needs torch (CPU wheels: pip install torch --index-url https://download.pytorch.org/whl/cpu).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - a message instead of a traceback
    sys.exit("torch_sdpa_baseline.py needs PyTorch: "
             "pip install torch --index-url https://download.pytorch.org/whl/cpu")

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def parse_shape(text):
    try:
        b, s, h, d = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is B,S,H,D (four integers), got '{text}'")
    if min(b, s, h, d) < 1:
        raise argparse.ArgumentTypeError(f"shape dims must be positive, got '{text}'")
    return b, s, h, d


def useful_gflop(shape, causal, mode):
    b, s, h, d = shape
    pairs = s * (s + 1) // 2 if causal else s * s
    fwd = 4.0 * b * h * d * pairs / 1e9
    return fwd if mode == "forward" else 3.5 * fwd


def time_calls(fn, repeats):
    """Median wall and CPU (all threads of this process) seconds of fn() after one warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def torch_round(shape, dtype, causal, repeats):
    b, s, h, d = shape
    gen = torch.Generator().manual_seed(1)
    # The FlashAttention layout [B, S, H, D], handed to SDPA as [B, H, S, D] views.
    q, k, v = (torch.rand(b, s, h, d, generator=gen, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
               for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (qt, kt, vt))
    do = torch.ones(b, h, s, d, dtype=dtype)

    def fused():
        for t in (qg, kg, vg):
            t.grad = None
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        o.backward(do)

    return {"forward": time_calls(forward, repeats), "fused": time_calls(fused, repeats)}


def tessera_round(args, shape, causal, json_path):
    cmd = [args.tessera, "bench", "attention", "--impl", "cpu", "--compare", "--pass", "forward,fused",
           "--shape", ",".join(map(str, shape)), "--dtype", args.dtype, "--repeats", str(args.repeats),
           "--json", str(json_path), "-q"]
    if causal:
        cmd.append("--causal")
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(json_path.read_text())


def collect(args, shape, causal, out_dir, mask):
    torch_runs = {"forward": ([], []), "fused": ([], [])}
    tessera_rows = {}
    doc = None
    for r in range(args.rounds):
        print(f"  round {r + 1}/{args.rounds}: torch", flush=True)
        for mode, (wall, cpu) in torch_round(shape, DTYPES[args.dtype], causal, args.repeats).items():
            torch_runs[mode][0].extend(wall)
            torch_runs[mode][1].extend(cpu)
        print(f"  round {r + 1}/{args.rounds}: tessera bench", flush=True)
        doc = tessera_round(args, shape, causal, out_dir / f"tessera_{mask}.json")
        for row in doc["rows"]:
            tessera_rows.setdefault((row["implementation"], row["mode"]), []).append(row["median_ms"])
    return torch_runs, tessera_rows, doc


def table_rows(shape, causal, torch_runs, tessera_rows):
    rows = []
    for mode in ("forward", "fused"):
        gf = useful_gflop(shape, causal, mode)
        wall, cpu = torch_runs[mode]
        rows.append({"implementation": "torch-sdpa", "mode": mode, "median_ms": 1e3 * statistics.median(wall),
                     "cpu_ms": 1e3 * statistics.median(cpu), "gflops": gf / statistics.median(wall)})
        for (impl, md), ms in sorted(tessera_rows.items()):
            if md == mode:
                rows.append({"implementation": f"tessera {impl}", "mode": mode, "median_ms": statistics.median(ms),
                             "gflops": gf / (statistics.median(ms) / 1e3)})
    return rows


def sgemm_rate(doc):
    for row in doc["rows"]:
        if row["implementation"] == "blas-gemm":
            return row["gflops"]
    return None


def peers_doc(args, shape, torch_runs):
    b, s, h, d = shape
    rows = []
    for mode in ("forward", "fused"):
        wall = torch_runs[mode][0]
        rows.append({"implementation": "torch-sdpa", "mode": mode, "B": b, "S": s, "H": h, "D": d,
                     "dtype": args.dtype, "median_ms": 1e3 * statistics.median(wall),
                     "min_ms": 1e3 * min(wall), "max_ms": 1e3 * max(wall)})
    return {"schema": "tessera-peers/1", "kernel": "attention",
            "source": f"PyTorch {torch.__version__} CPU scaled_dot_product_attention "
                      f"({torch.get_num_threads()} threads)",
            "device": "cpu", "dims": ["B", "S", "H", "D"], "rows": rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tessera", default="build/release/bin/tessera")
    ap.add_argument("--shapes", default="1,2048,8,128", help="B,S,H,D;... (semicolon-separated)")
    ap.add_argument("--dtype", default="f32", choices=sorted(DTYPES))
    ap.add_argument("--masks", default="full,causal")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="default: every core (torch and tessera alike)")
    ap.add_argument("--out-dir", default="attention-vs-torch")
    args = ap.parse_args()
    shapes = [parse_shape(s) for s in args.shapes.split(";") if s]
    masks = [m.strip() for m in args.masks.split(",") if m.strip()]
    bad = [m for m in masks if m not in ("full", "causal")]
    if bad or not masks:
        ap.error(f"--masks takes full and/or causal, got '{args.masks}'")
    if args.rounds < 1 or args.repeats < 1:
        ap.error("--rounds and --repeats must be >= 1")
    if not Path(args.tessera).exists():
        ap.error(f"no tessera binary at {args.tessera} (build first, or pass --tessera)")
    torch.set_num_threads(args.threads or os.cpu_count())
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    summary = []
    for shape in shapes:
        for mask in masks:
            causal = mask == "causal"
            print(f"B,S,H,D={','.join(map(str, shape))} {args.dtype} {mask}", flush=True)
            torch_runs, tessera_rows, doc = collect(args, shape, causal, out_dir, mask)
            (out_dir / f"torch_sdpa_{mask}.json").write_text(json.dumps(peers_doc(args, shape, torch_runs), indent=1))
            rows = table_rows(shape, causal, torch_runs, tessera_rows)
            sgemm = sgemm_rate(doc)
            for r in rows:
                r.update(shape="x".join(map(str, shape)), mask=mask, dtype=args.dtype,
                         sgemm_gflops=sgemm, of_sgemm=(r["gflops"] / sgemm if sgemm else None))
            summary += rows

    lines = [f"load average at the end: {os.getloadavg()[0]:.2f}; torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads", "",
             "| shape | mask | pass | implementation | median ms | GFLOP/s (useful) | of sgemm (same run) | torch CPU ms |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for r in summary:
        frac = f"{100 * r['of_sgemm']:.0f} %" if r["of_sgemm"] else "-"
        cpu = f"{r['cpu_ms']:.1f}" if "cpu_ms" in r else ""
        lines.append(f"| {r['shape']} | {r['mask']} | {r['mode']} | {r['implementation']} | {r['median_ms']:.1f} "
                     f"| {r['gflops']:.0f} | {frac} | {cpu} |")
    text = "\n".join(lines)
    print(text)
    (out_dir / "summary.md").write_text(text + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
