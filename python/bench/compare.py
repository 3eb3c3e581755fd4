"""Tessera through PyTorch and JAX against the frameworks' own losses, side by side in one run.

One training step (loss + gradients of x and w) per method, each method in its own process:
  tessera-torch         tessera.torch.linear_cross_entropy (custom op + autograd)
  torch-lce-chunked     torch.nn.functional.linear_cross_entropy, options=LinearCrossEntropyOptions()
  torch-lce-reference   torch.nn.functional.linear_cross_entropy, options=None
  torch-compile         torch.compile of F.cross_entropy((x @ w.T).float(), y)   (inductor)
  tessera-jax           jax.jit(value_and_grad(tessera.jax.linear_cross_entropy))
  jax-jit               jax.jit(value_and_grad(materialized loss: logits, logsumexp, take))
Time: the median of --reps steps after one warm-up step (compilation is in the warm-up, reported
as first_s). Memory: the peak resident set during the timed steps above the resident set before
them (Linux VmHWM, reset with /proc/self/clear_refs): the extra memory one step needs (gradients
and all temporaries), the inputs excluded. XLA keeps its CPU buffers from the warm-up step, so
for JAX the compiled step's own figure (temporaries + outputs, memory_analysis) is given too.

    python python/bench/compare.py --shape 2048,1024,32768 --dtype f32,bf16 --reps 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

METHODS = ["tessera-torch", "torch-lce-chunked", "torch-lce-reference", "torch-compile", "tessera-jax", "jax-jit"]


def rss_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_one(method, dtype, B, H, V, reps):
    import numpy as np
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((B, H)) * 0.5).astype(np.float32)
    w = (rng.standard_normal((V, H)) * 0.05).astype(np.float32)
    y = rng.integers(0, V, B).astype(np.int64)

    if method.startswith("jax") or method == "tessera-jax":
        import jax
        import jax.numpy as jnp
        dt = jnp.bfloat16 if dtype == "bf16" else jnp.float32
        xj, wj, yj = jnp.asarray(x, dt), jnp.asarray(w, dt), jnp.asarray(y, jnp.int32)
        if method == "tessera-jax":
            import tessera.jax as tj
            loss = lambda x, w: tj.linear_cross_entropy(x, w, yj)  # noqa: E731
        else:
            def loss(x, w):
                z = (x @ w.T).astype(jnp.float32)
                lse = jax.nn.logsumexp(z, axis=-1)
                return jnp.mean(lse - jnp.take_along_axis(z, yj[:, None], axis=-1)[:, 0])
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        # XLA keeps its CPU buffers between calls, so the RSS peak misses them: also report what
        # the compiled step allocates besides its arguments (temporaries + outputs).
        ma = f.lower(xj, wj).compile().memory_analysis()
        xla_mb = (ma.temp_size_in_bytes + ma.output_size_in_bytes) / 2**20 if ma is not None else None

        def step():
            jax.block_until_ready(f(xj, wj))
    else:
        xla_mb = None
        import torch
        import torch.nn.functional as F
        dt = torch.bfloat16 if dtype == "bf16" else torch.float32
        xt = torch.from_numpy(x).to(dt).requires_grad_()
        wt = torch.from_numpy(w).to(dt).requires_grad_()
        yt = torch.from_numpy(y)
        if method == "tessera-torch":
            import tessera.torch as tt
            loss = lambda: tt.linear_cross_entropy(xt, wt, yt)  # noqa: E731
        elif method == "torch-lce-chunked":
            opts = torch.nn.LinearCrossEntropyOptions()
            loss = lambda: F.linear_cross_entropy(xt, wt, yt, options=opts)  # noqa: E731
        elif method == "torch-lce-reference":
            loss = lambda: F.linear_cross_entropy(xt, wt, yt, options=None)  # noqa: E731
        else:
            g = torch.compile(lambda x, w, y: F.cross_entropy((x @ w.T).float(), y))
            loss = lambda: g(xt, wt, yt)  # noqa: E731

        def step():
            xt.grad = wt.grad = None
            loss().backward()
            xt.grad = wt.grad = None

    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = rss_kb("VmRSS")
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak = rss_kb("VmHWM")
    return {"method": method, "dtype": dtype, "median_s": statistics.median(times), "min_s": min(times),
            "first_s": first, "extra_mb": (peak - base) / 1024, "xla_temp_out_mb": xla_mb}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="2048,1024,32768")
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per method (warm-up + reps)")
    ap.add_argument("--one", default="")  # internal: run one method in this process
    a = ap.parse_args()
    B, H, V = (int(s) for s in a.shape.split(","))
    if a.one:
        method, dtype = a.one.split(":")
        print(json.dumps(run_one(method, dtype, B, H, V, a.reps)))
        return
    rows = []
    print(f"B={B} H={H} V={V}; logits would be {B * V * 4 / 2**20:.0f} MiB in f32; {os.cpu_count()} CPUs")
    print(f"{'dtype':5} {'method':20} {'median s':>9} {'first s':>8} {'extra MiB':>10} {'x tessera':>10} {'XLA MiB':>8}")
    for dtype in a.dtype.split(","):
        base = None
        for m in a.methods.split(","):
            try:
                p = subprocess.run([sys.executable, __file__, "--shape", a.shape, "--reps", str(a.reps),
                                    "--one", f"{m}:{dtype}"], capture_output=True, text=True, timeout=a.timeout)
            except subprocess.TimeoutExpired:
                print(f"{dtype:5} {m:20} timed out after {a.timeout:.0f} s (warm-up + {a.reps} steps)", flush=True)
                continue
            if p.returncode != 0:
                print(f"{dtype:5} {m:20} failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            if m.startswith("tessera"):
                base = r["median_s"]
            rows.append(r)
            ratio = f"{r['median_s'] / base:.2f}" if base else ""
            xla = f"{r['xla_temp_out_mb']:8.0f}" if r.get("xla_temp_out_mb") is not None else ""
            print(f"{dtype:5} {m:20} {r['median_s']:9.3f} {r['first_s']:8.2f} {r['extra_mb']:10.0f} {ratio:>10} {xla}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"shape": [B, H, V], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
