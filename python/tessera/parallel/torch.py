"""torch.distributed compositions of Tessera's kernels (gloo on CPU tensors, NCCL on CUDA).

    import tessera.parallel.torch as tpt
    out = tpt.expert_parallel_grouped_matmul(x, expert_ids, w_local, num_experts=E, expert_start=s)
    o = tpt.context_parallel_attention(q, k, v, causal=True)

Both are differentiable (autograd through the collectives) and equal the single-device result.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from .. import torch as tt

__all__ = ["expert_parallel_grouped_matmul", "context_parallel_attention", "agree"]


def agree(error: Optional[str], group=None, device: Optional[torch.device] = None) -> None:
    """Every rank calls this with its own error (None when fine); if any rank has one, every rank
    raises ValueError with all of them, each naming its rank. One small all-reduce when all is well."""
    dev = device if device is not None and device.type == "cuda" else torch.device("cpu")
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=dev)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    if int(flag.item()) == 0:
        return
    messages: List[Optional[str]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(messages, error, group=group)
    raise ValueError("; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None))


def _checked(check, group, device) -> None:
    """Runs check() (raises on bad input) and agrees on its outcome across the ranks."""
    try:
        check()
        error = None
    except (ValueError, TypeError, RuntimeError) as e:
        error = str(e)
    agree(error, group, device)


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with uneven splits; its gradient is the all-to-all with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send: List[int], recv: List[int], group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        grad = g.new_empty((sum(ctx.send),) + tuple(g.shape[1:]))
        dist.all_to_all_single(grad, g.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return grad, None, None, None


def _gather_ints(values: Sequence[int], group, device) -> torch.Tensor:
    """[world, len(values)] int64: every rank's values."""
    mine = torch.tensor(list(values), dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return torch.stack(out).cpu()


def _check_experts(x, expert_ids, w_local, num_experts, transpose_rhs):
    if x.dim() != 2:
        raise ValueError(f"x must be [T, K], got shape {tuple(x.shape)}")
    if expert_ids.dim() != 1 or expert_ids.shape[0] != x.shape[0]:
        raise ValueError(f"expert_ids must be [T={x.shape[0]}], got shape {tuple(expert_ids.shape)}")
    if expert_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"expert_ids must be int32 or int64, got {expert_ids.dtype}")
    if w_local.dim() != 3 or w_local.shape[2 if transpose_rhs else 1] != x.shape[1]:
        raise ValueError(f"w_local must be [E_local, K={x.shape[1]}, N]"
                         f"{' (transposed: [E_local, N, K])' if transpose_rhs else ''}, got {tuple(w_local.shape)}")
    if expert_ids.numel() and (int(expert_ids.min()) < 0 or int(expert_ids.max()) >= num_experts):
        raise ValueError(f"expert_ids must lie in [0, num_experts={num_experts}), got "
                         f"[{int(expert_ids.min())}, {int(expert_ids.max())}]")


def _check_ranges(ranges: torch.Tensor, num_experts: int) -> None:
    """ranges [world, 2] = (expert_start, E_local) per rank: must tile [0, num_experts) in rank order."""
    nxt = 0
    for r, (start, count) in enumerate(ranges.tolist()):
        if start != nxt:
            raise ValueError(f"experts must be split in rank order: rank {r} starts at expert {start}, expected {nxt}")
        nxt = start + count
    if nxt != num_experts:
        raise ValueError(f"the ranks' experts cover [0, {nxt}), not num_experts={num_experts}")


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """counts [world, E_local]: rows arrive source-major (for s, for e); returns the permutation
    that orders them expert-major (for e, for s)."""
    world, e_local = counts.shape
    starts = torch.zeros_like(counts)
    starts.view(-1)[1:] = torch.cumsum(counts.reshape(-1), 0)[:-1]
    pieces = [torch.arange(int(starts[s, e]), int(starts[s, e] + counts[s, e]))
              for e in range(e_local) for s in range(world)]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


def expert_parallel_grouped_matmul(x: torch.Tensor, expert_ids: torch.Tensor, w_local: torch.Tensor, *,
                                   num_experts: int, expert_start: int, group=None,
                                   transpose_rhs: bool = False, implementation: Optional[str] = None) -> torch.Tensor:
    """out[t] = x[t] · W[expert_ids[t]] with the experts sharded over the ranks of ``group``.

    x [T, K] and expert_ids [T] are this rank's tokens (top-1 routing: repeat a token once per
    chosen expert for top-k); w_local [E_local, K, N] (or [E_local, N, K] with transpose_rhs) holds
    experts [expert_start, expert_start + E_local); the ranks' ranges tile [0, num_experts) in rank
    order (E_local may differ per rank, and may be 0). Tokens go to their expert's rank in one
    all-to-all, each rank runs one ``grouped_matmul`` over its experts, and one all-to-all brings
    the rows back. Differentiable in x and w_local. Returns [T, N] in x's dtype.
    """
    dev = x.device
    _checked(lambda: _check_experts(x, expert_ids, w_local, num_experts, transpose_rhs), group, dev)
    ranges = _gather_ints([expert_start, w_local.shape[0]], group, dev)
    _checked(lambda: _check_ranges(ranges, num_experts), group, dev)
    me = dist.get_rank(group)
    order = torch.argsort(expert_ids.to(torch.int64), stable=True)
    counts = torch.bincount(expert_ids.to(torch.int64).cpu(), minlength=num_experts)
    every = _gather_ints(counts.tolist(), group, dev)  # [world, num_experts]
    bounds = [(s, s + n) for s, n in ranges.tolist()]
    send = [int(counts[a:b].sum()) for a, b in bounds]
    a, b = bounds[me]
    mine = every[:, a:b]  # [world, E_local]: rows each source sends me, per local expert
    recv = mine.sum(1).tolist()
    rows = _AllToAll.apply(x[order.to(dev)], send, recv, group)
    perm = _expert_major(mine).to(dev)
    sizes = mine.sum(0).to(torch.int32)
    local = tt.grouped_matmul(rows[perm], w_local, sizes, transpose_rhs=transpose_rhs, implementation=implementation)
    back = torch.empty_like(perm)
    back[perm] = torch.arange(perm.numel(), device=dev)
    out_sorted = _AllToAll.apply(local[back], recv, send, group)
    unsort = torch.empty_like(order)
    unsort[order] = torch.arange(order.numel(), device=order.device)
    return out_sorted[unsort.to(dev)]


class _GatherSequence(torch.autograd.Function):
    """Concatenates every rank's shard along dim 1 (ragged lengths); the gradient of a rank's
    shard is the sum over ranks of the gradient at its positions (an all-reduce, then a slice)."""

    @staticmethod
    def forward(ctx, t, lengths: List[int], group):
        me = dist.get_rank(group)
        ctx.lengths, ctx.me, ctx.group = lengths, me, group
        longest = max(lengths)
        padded = t.new_zeros((t.shape[0], longest) + tuple(t.shape[2:]))
        padded[:, :t.shape[1]] = t
        parts = [torch.empty_like(padded) for _ in lengths]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([p[:, :n] for p, n in zip(parts, lengths)], dim=1)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        start = sum(ctx.lengths[:ctx.me])
        return g[:, start:start + ctx.lengths[ctx.me]], None, None


def _check_shards(q, k, v, causal, window_left, window_right):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, S_local, H, D], got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[1] != q.shape[1] or v.shape[1] != q.shape[1]:
        raise ValueError(f"q, k and v must hold the same positions (S_local {q.shape[1]}, {k.shape[1]}, {v.shape[1]})")
    if not causal and (window_left >= 0 or window_right >= 0):
        raise ValueError("context_parallel_attention: a window needs causal=True here "
                         "(non-causal windows are not supported across shards)")


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group=None,
                               causal: bool = False, window_left: int = -1, scale: float = 0.0,
                               softcap: float = 0.0, return_lse: bool = False,
                               implementation: Optional[str] = None):
    """Attention over a sequence sharded contiguously across the ranks of ``group``.

    q [B, S_r, Hq, D], k [B, S_r, Hkv, D], v [B, S_r, Hkv, Dv]: this rank's positions
    [start_r, start_r + S_r) of the sequence, shards in rank order (S_r may differ per rank, 0
    included). Keys and values are all-gathered; with ``causal`` each rank attends over the keys
    up to its last position only, so query i sees positions ≤ start_r + i (``attention``'s
    bottom-right alignment with Sk = start_r + S_r) and ``window_left`` counts back from there.
    Returns this rank's o [B, S_r, Hq, Dv] (and lse [B, Hq, S_r] with return_lse); differentiable in
    q, k, v: dk and dv are summed over the ranks whose queries used them.
    """
    dev = q.device
    _checked(lambda: _check_shards(q, k, v, causal, window_left, -1), group, dev)
    lengths = _gather_ints([q.shape[1]], group, dev)[:, 0].tolist()
    me = dist.get_rank(group)
    k_all = _GatherSequence.apply(k, lengths, group)
    v_all = _GatherSequence.apply(v, lengths, group)
    if causal:
        end = sum(lengths[:me + 1])
        k_all, v_all = k_all[:, :end].contiguous(), v_all[:, :end].contiguous()
    return tt.attention(q, k_all, v_all, causal=causal, window_left=window_left, scale=scale, softcap=softcap,
                        return_lse=return_lse, implementation=implementation)
