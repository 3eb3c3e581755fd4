"""Timing shared by the PyTorch baseline scripts of bench/ (imported from beside them): CUDA
events on a GPU (timed), the wall clock on the CPU (wall)."""
import statistics
import time

import torch


def timed(fn, warmup, iters):
    """first call, then `warmup` untimed calls, then `iters` timed ones: first/median/min/max ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def once():
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    first = once()
    for _ in range(warmup):
        once()
    runs = sorted(once() for _ in range(iters))
    return {"first_ms": first, "median_ms": statistics.median(runs), "min_ms": runs[0], "max_ms": runs[-1]}


def wall(fn, warmup, iters):
    """CPU: first call, then `warmup` untimed calls, then `iters` timed ones (perf_counter):
    median/min/max ms."""
    fn()
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(runs), "min_ms": min(runs), "max_ms": max(runs)}
