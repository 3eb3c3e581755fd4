"""CUDA-event timing shared by the PyTorch baseline scripts of bench/ (imported from beside them)."""
import statistics

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
