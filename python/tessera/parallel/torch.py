"""torch.distributed compositions of Tessera's kernels (gloo on CPU tensors, NCCL on CUDA).

    import tessera.parallel.torch as tpt
    out = tpt.expert_parallel_grouped_matmul(x, expert_ids, w_local, num_experts=E, expert_start=s)
    o = tpt.context_parallel_attention(q, k, v, causal=True)
    o = tpt.context_parallel_paged_decode(q, k_cache, v_cache, page_table, kv_lens, cu_q_lens)

The first two are differentiable (autograd through the collectives); the decode is forward only,
like paged_attention. Each equals the single-device result.
"""
from __future__ import annotations

import hashlib
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from .. import _ext
from .. import torch as tt
from ..torch import _dense
from .._registry import KERNELS, dtype_name, memory_budget_bytes, older_keyword
from . import _vocab

__all__ = ["expert_parallel_grouped_matmul", "context_parallel_attention", "context_parallel_paged_decode",
           "vocab_parallel_linear_cross_entropy", "agree"]


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
    except (ValueError, TypeError, RuntimeError, IndexError) as e:
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


def _agree_on(what: str, settings: dict, group, device) -> None:
    """Every rank must call with the same `settings` (options, the shapes and dtypes that must
    match, which optional inputs are given). One all-gather of an 8-byte digest per rank; on a
    mismatch every rank raises, naming the settings that differ and each rank's values. Before
    it, a mismatch hung a rank in a collective the others never entered, aborted gloo (tensors of
    different sizes), or returned a different loss on each rank (a review)."""
    blob = repr(sorted(settings.items())).encode()
    digest = int.from_bytes(hashlib.sha256(blob).digest()[:8], "little", signed=True)
    got = _gather_ints([digest], group, device)[:, 0].tolist()
    if all(d == got[0] for d in got):
        return
    everyone: List[Optional[dict]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, settings, group=group)
    diff = [k for k in sorted(settings) if len({repr(e.get(k)) for e in everyone}) > 1]
    per_rank = "; ".join(f"rank {r}: " + ", ".join(f"{k}={e.get(k)!r}" for k in diff) for r, e in enumerate(everyone))
    raise ValueError(f"{what}: the ranks must agree on {', '.join(diff)}; {per_rank}")


def _same_content(what: str, tensors: dict, group, device) -> None:
    """Inputs that must hold the same values on every rank (labels, token weights), compared
    exactly: one MAX and one MIN all-reduce of them all; every rank sees the same verdict. Call
    after _agree_on has made their shapes equal (gloo aborts on different sizes)."""
    given = {n: t for n, t in tensors.items() if t is not None and t.numel()}
    if not given:
        return
    flat = torch.cat([t.detach().reshape(-1).to(torch.float64) for t in given.values()]).to(device)
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    same = (hi == lo) | (torch.isnan(hi) & torch.isnan(lo))
    if bool(same.all()):
        return
    bad, at = [], 0
    for n, t in given.items():
        if not bool(same[at:at + t.numel()].all()):
            bad.append(n)
        at += t.numel()
    raise ValueError(f"{what}: {', '.join(bad)} must hold the same values on every rank; they differ")


def _check_implementation(kernel: str, implementation: Optional[str], device: torch.device) -> None:
    """A name (or comma list) the kernel knows, one of them able to run on `device`: an
    implementation that can run on one rank only raised there alone, at the kernel call."""
    if not implementation:
        return
    impls = {i["name"]: i for i in KERNELS[kernel].implementations}
    names = [n for n in implementation.split(",") if n]
    unknown = [n for n in names if n not in impls]
    if unknown:
        raise ValueError(f"{kernel}: unknown implementation {unknown[0]!r} (have: {', '.join(impls)})")
    if not any(impls[n]["available"] and impls[n]["device"] == device.type for n in names):
        raise ValueError(f"{kernel}: no implementation of {implementation!r} can run on {device.type} here")


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
    if w_local.dtype != x.dtype:
        raise TypeError(f"w_local must be {x.dtype} like x, got {w_local.dtype}")
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

    def check():
        _check_experts(x, expert_ids, w_local, num_experts, transpose_rhs)
        _check_implementation("grouped_matmul", implementation, dev)
    _checked(check, group, dev)
    n_out = w_local.shape[1 if transpose_rhs else 2] if w_local.dim() == 3 else -1
    _agree_on("expert_parallel_grouped_matmul", dict(K=x.shape[1], N=n_out, dtype=str(x.dtype),
                                                     num_experts=num_experts, transpose_rhs=bool(transpose_rhs)),
              group, dev)
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

    def check():
        _check_shards(q, k, v, causal, window_left, -1)
        _check_implementation("attention", implementation, dev)
    _checked(check, group, dev)
    _agree_on("context_parallel_attention",
              dict(B=q.shape[0], Hq=q.shape[2], Hkv=k.shape[2], D=q.shape[3], Dv=v.shape[3], dtype=str(q.dtype),
                   causal=bool(causal), window_left=int(window_left), scale=float(scale), softcap=float(softcap),
                   return_lse=bool(return_lse)), group, dev)
    lengths = _gather_ints([q.shape[1]], group, dev)[:, 0].tolist()
    me = dist.get_rank(group)
    k_all = _GatherSequence.apply(k, lengths, group)
    v_all = _GatherSequence.apply(v, lengths, group)
    if causal:
        end = sum(lengths[:me + 1])
        k_all, v_all = k_all[:, :end].contiguous(), v_all[:, :end].contiguous()
    return tt.attention(q, k_all, v_all, causal=causal, window_left=window_left, scale=scale, softcap=softcap,
                        return_lse=return_lse, implementation=implementation)


# ---- decode context parallelism over a paged KV cache ----

def _check_decode_rows(q, k_cache, page_table, kv_lens, cu_q_lens, sink_rank: int, world: int) -> None:
    name = "context_parallel_paged_decode"
    if q.dim() != 3 or page_table.dim() != 2 or kv_lens.dim() != 1 or cu_q_lens.dim() != 1:
        raise ValueError(f"{name}: q must be [T, Hq, D], page_table [N, max_pages], kv_lens [N], cu_q_lens [N + 1]; "
                         f"got {tuple(q.shape)}, {tuple(page_table.shape)}, {tuple(kv_lens.shape)}, "
                         f"{tuple(cu_q_lens.shape)}")
    q_lens = (cu_q_lens[1:] - cu_q_lens[:-1]).tolist()
    long = [s for s, n in enumerate(q_lens) if n > 1]
    if long:
        raise ValueError(f"{name}: decode rows only (q_len 0 or 1 per sequence), sequence {long[0]} has "
                         f"q_len {q_lens[long[0]]}")
    if not 0 <= sink_rank < world:
        raise ValueError(f"{name}: sink_rank={sink_rank} is not a rank of the group [0, {world})")
    if (k_cache.dim() < 1 or k_cache.shape[0] == 0 or page_table.shape[1] == 0) and bool((kv_lens != 0).any()):
        raise ValueError(f"{name}: this rank holds no page but kv_lens = {kv_lens.tolist()}")


def _local_decode(q, k_cache, v_cache, page_table, kv_lens, cu_q_lens, sinks, kw: dict):
    """This rank's partial (o f32, lse): rows of sequences with no key here get o = 0 and lse = the
    sink (−inf without one): the kernel wants q_len <= kv_len, so they run on one stand-in key
    (page 0, slot 0) whose result is replaced."""
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    empty = (kv_lens == 0) & (q_lens > 0)
    T, Hq = q.shape[0], q.shape[1]
    if k_cache.shape[0] == 0 or page_table.shape[1] == 0 or T == 0:  # no page here: every row is empty
        o = q.new_zeros((T, Hq, v_cache.shape[-1]), dtype=torch.float32)
        lse = torch.full((T, Hq), float("-inf"), device=q.device)
    else:
        table, lens = page_table.clone(), kv_lens.clone()
        table[empty, 0] = 0
        lens[empty] = 1
        o, lse = tt.paged_attention(q, k_cache, v_cache, table, lens, cu_q_lens, sinks=sinks, causal=False,
                                    return_lse=True, **kw)
        o = o.float()
    rows = torch.repeat_interleave(empty, q_lens.long()).to(q.device)  # the rows of empty sequences
    if bool(rows.any()):
        o[rows] = 0.0
        lse[rows] = float("-inf") if sinks is None else sinks.float().expand(int(rows.sum()), Hq)
    return o, lse


def _agreed_call(group, sink_rank: int, q, v_cache, cu_q_lens, sinks, scale, softcap, return_lse, kv_scales) -> None:
    """What every rank must share: the rows [T, Hq, Dv], cu_q_lens itself (a checksum of it let
    two different row layouts through: a review), sink_rank, whether sinks are given, the options."""
    _agree_on("context_parallel_paged_decode",
              dict(T=q.shape[0], Hq=q.shape[1], Dv=v_cache.shape[-1] if v_cache.dim() else -1, dtype=str(q.dtype),
                   cu_q_lens=tuple(int(c) for c in cu_q_lens.tolist()), sink_rank=sink_rank,
                   sinks=sinks is not None, scale=scale, softcap=float(softcap), return_lse=bool(return_lse),
                   kv_scales=tuple(float(x) for x in kv_scales)),
              group, q.device)


def context_parallel_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                  page_table: torch.Tensor, kv_lens: torch.Tensor, cu_q_lens: torch.Tensor, *,
                                  group=None, sinks: Optional[torch.Tensor] = None, sink_rank: int = 0,
                                  scale: Optional[float] = None, softcap: float = 0.0, return_lse: bool = False,
                                  implementation: Optional[str] = None, k_scale: float = 1.0, v_scale: float = 1.0):
    """Decode over a paged KV cache whose keys are sharded across the ranks of ``group`` (vLLM's
    decode context parallelism).

    Every rank passes the same decode rows — q [T, Hq, D] and cu_q_lens [N + 1], at most one query
    per sequence — and its own share of every sequence's keys: its cache (k_cache [P_r, page_size,
    Hkv, D], v_cache [P_r, page_size, Hkv, Dv], P_r may be 0), page_table [N, max_pages_r] with
    this rank's page ids, and kv_lens [N] (0 where it holds none of a sequence). The shares of a
    sequence together hold all its keys, split any way (a decode row sees every key of its
    sequence, so order does not matter). Each rank runs paged_attention on its share; the partial
    (o, lse) are all-gathered and merged by lse. ``sinks`` [Hq] (given on every rank or on none)
    enter on ``sink_rank`` only: a sink is one more logit of the row's softmax, so counted on
    every rank it would count once per rank. Partial o are merged in f32 (a bf16 q's partials are
    rounded to bf16 once first). Returns o [T, Hq, Dv] in q's dtype (and lse [T, Hq] f32 with
    return_lse), the same on every rank. Index tensors on the GPU are copied to the host. Forward
    only, like paged_attention. An error on any rank (these checks or the kernel's) is raised on
    every rank before the partials move. An f8e4m3 cache (torch.float8_e4m3fn) takes its
    ``k_scale`` and ``v_scale``, the same on every rank.
    """
    dev = q.device
    page_table, kv_lens, cu_q_lens = page_table.cpu(), kv_lens.cpu(), cu_q_lens.cpu()
    world, me = dist.get_world_size(group), dist.get_rank(group)
    def check():
        _check_decode_rows(q, k_cache, page_table, kv_lens, cu_q_lens, sink_rank, world)
        _check_implementation("paged_attention", implementation, dev)
    _checked(check, group, dev)
    _agreed_call(group, sink_rank, q, v_cache, cu_q_lens, sinks, scale, softcap, return_lse, (k_scale, v_scale))
    kw = {"softcap": softcap, "implementation": implementation, "k_scale": k_scale, "v_scale": v_scale}
    if scale is not None:
        kw["scale"] = scale
    part = {}
    _checked(lambda: part.update(zip(("o", "lse"), _local_decode(q, k_cache, v_cache, page_table, kv_lens, cu_q_lens,
                                                                    sinks if me == sink_rank else None, kw))),
             group, dev)
    parts_o = [torch.empty_like(part["o"]) for _ in range(world)]
    parts_lse = [torch.empty_like(part["lse"]) for _ in range(world)]
    dist.all_gather(parts_o, part["o"].contiguous(), group=group)
    dist.all_gather(parts_lse, part["lse"].contiguous(), group=group)
    L = torch.stack(parts_lse)  # [R, T, Hq]
    total = torch.logsumexp(L, dim=0)  # −inf where no rank saw anything; NaN propagates
    w = torch.where(torch.isneginf(L), 0.0, torch.exp(L - total))  # a partial that saw nothing weighs 0
    out = (w.unsqueeze(-1) * torch.stack(parts_o)).sum(0).to(q.dtype)
    return (out, total) if return_lse else out


# ---- vocab-parallel linear cross-entropy ----

_REL_IGNORE = -(2 ** 62)  # the relative labels' ignore value: outside (−V, V) for any V


def _check_vocab_slices(slices: torch.Tensor) -> int:
    """slices [world, 2] = (vocab_start, V_local): must tile [0, V) in rank order; returns V."""
    nxt = 0
    for r, (start, count) in enumerate(slices.tolist()):
        if start != nxt:
            raise ValueError(f"the classifier must be split in rank order: rank {r} starts at class {start}, expected {nxt}")
        nxt = start + count
    return nxt


def _gather_ragged(t: torch.Tensor, lengths: List[int], group) -> torch.Tensor:
    """Concatenates every rank's 1-D tensor (lengths may differ)."""
    padded = t.new_zeros(max(lengths))
    padded[:t.shape[0]] = t
    parts = [torch.empty_like(padded) for _ in lengths]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:n] for p, n in zip(parts, lengths)])


def _lce_options(o: dict, vocab_total: int, argmax: bool) -> dict:
    return dict(reduction=o["reduction"], ignore_index=_REL_IGNORE, label_smoothing=float(o["label_smoothing"]),
                z_loss_weight=float(o["z_loss_weight"]), softcap=float(o["softcap"]), w_layout=o["w_layout"],
                return_argmax=argmax, vocab_total=vocab_total, implementation=o["implementation"] or "",
                memory_budget=o["memory_budget"])


class _VocabParallelLCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, labels, token_weights, class_weights, o):
        group, start, vt = o["group"], o["vocab_start"], o["vocab_total"]
        valid = labels != o["ignore_index"]
        rel = torch.where(valid, labels.to(torch.int64) - start, torch.full_like(labels, _REL_IGNORE, dtype=torch.int64))
        cw_full = o["class_weights_full"]
        cw_rot = None if cw_full is None else torch.roll(cw_full, -start)
        want_argmax = o["return_argmax"] or o["return_token_accuracy"]
        raw = torch.ops.tessera.linear_cross_entropy(x=x, w=w, labels=rel, bias=bias, token_weights=token_weights,
                                                     class_weights=cw_rot, **_lce_options(o, vt, want_argmax))
        lse_l, zy, sz = raw[0], raw[1], raw[2]
        m = lse_l.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        sums = torch.stack([torch.exp(lse_l - m), zy, sz])  # three floats per token, one all-reduce
        dist.all_reduce(sums, group=group)
        lse = m + torch.log(sums[0])
        tw = torch.ones_like(lse) if token_weights is None else token_weights.to(torch.float32)
        sigma_y = torch.ones_like(lse) if cw_full is None else cw_full[torch.where(valid, labels, 0).long()]
        weight = torch.where(valid, tw * sigma_y, torch.zeros_like(lse))
        sigma_sum = float(vt) if cw_full is None else cw_full.sum()
        per_token, z_part = _vocab.token_losses(torch.where, lse, sums[1], sums[2], valid, weight, tw,
                                                smoothing=o["label_smoothing"], z_loss=o["z_loss_weight"],
                                                vocab=vt, sigma_sum=sigma_sum)
        loss = _vocab.reduce(torch.where, per_token, weight, o["reduction"])
        extras = []
        if want_argmax:
            best = raw[4].clone()
            dist.all_reduce(best, op=dist.ReduceOp.MAX, group=group)
            big = torch.iinfo(torch.int64).max
            idx = torch.where(raw[4] == best, raw[3] + start, torch.full_like(raw[3], big))
            dist.all_reduce(idx, op=dist.ReduceOp.MIN, group=group)
            if o["return_argmax"]:
                extras.append(idx)
        if o["return_z_loss"]:
            extras.append(_vocab.reduce(torch.where, z_part, weight, o["reduction"]))
        if o["return_token_accuracy"]:
            kept = valid.sum()
            hits = (valid & (idx == labels)).sum()
            extras.append(torch.where(kept == 0, torch.zeros((), dtype=torch.float32), hits / kept.clamp(min=1)).float())
        if o["return_lse"]:
            extras.append(lse)
        ctx.save_for_backward(x, w, bias, rel, token_weights, cw_rot, lse)
        ctx.o = o
        ctx.mark_non_differentiable(*extras)
        return (loss, *extras)

    @staticmethod
    def backward(ctx, g, *unused):
        x, w, bias, rel, tw, cw_rot, lse = ctx.saved_tensors
        o = ctx.o
        # A frozen w slice (or bias) skips its gradient; dx is always formed: every rank all-reduces it.
        want_dw, want_db = ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2]
        skip = ([] if want_dw else ["dw"]) + (["dbias"] if bias is not None and not want_db else [])
        grads = iter(torch.ops.tessera.linear_cross_entropy_backward(
            x=x, w=w, labels=rel, grad_loss=g.to(torch.float32).contiguous(), bias=bias, token_weights=tw,
            class_weights=cw_rot, lse=lse, skip=",".join(skip), **_lce_options(o, o["vocab_total"], False)))
        dx = next(grads).contiguous()
        dist.all_reduce(dx, group=o["group"])
        dw = next(grads) if want_dw else None
        dbias = next(grads) if want_db else None
        return dx, dw, dbias, None, None, None, None


def vocab_parallel_linear_cross_entropy(x, w_local, labels, *, vocab_start: int, group=None, bias=None,
                                        token_weights=None, class_weights=None, reduction: str = "mean",
                                        ignore_index: int = -100, label_smoothing: float = 0.0,
                                        z_loss_weight: float = 0.0, softcap: float = 0.0, w_layout: str = "auto",
                                        return_argmax: bool = False, return_z_loss: bool = False,
                                        return_token_accuracy: bool = False, return_lse: bool = False,
                                        implementation: Optional[str] = None, memory_budget: Optional[int] = None,
                                        soft_cap: Optional[float] = None):
    """``tessera.torch.linear_cross_entropy`` with the classifier split over the ranks of ``group``.

    w_local holds classes [vocab_start, vocab_start + V_local) (either layout, as ``w_layout``);
    bias and class_weights are the matching slices; x, labels and token_weights are the same on
    every rank (labels global). The slices must tile [0, V) in rank order (V_local may differ).
    Each rank runs the kernel's partial form on its slice; one max and one sum all-reduce of three
    floats per token combine the statistics; the backward all-reduces dx. Same results as one
    device (every option), same return order as the single-device function.
    """
    x, labels, bias, token_weights = (_dense(t) for t in (x, labels, bias, token_weights))
    w_local = _dense(w_local, transposed=True)
    dev = x.device
    lead = tuple(x.shape[:-1])

    v_box: List[int] = []
    local = {}

    def check():  # everything that can fail on one rank alone, agreed before any other collective
        local["softcap"] = older_keyword("linear_cross_entropy", "softcap", softcap, soft_cap, 0.0)
        local["budget"] = memory_budget_bytes(memory_budget, "linear_cross_entropy")
        if tuple(labels.shape) != lead:
            raise ValueError(f"labels shape {tuple(labels.shape)} does not match x's leading axes {lead}")
        if labels.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"labels must be int32 or int64, got {labels.dtype}")
        v_box.append(_local_vocab(x, w_local, w_layout))
        if class_weights is not None and tuple(class_weights.shape) != (v_box[0],):
            raise ValueError(f"class_weights must be this rank's slice [V_local={v_box[0]}], got "
                             f"{tuple(class_weights.shape)}")
        _check_implementation("linear_cross_entropy", implementation, dev)
    _checked(check, group, dev)
    softcap, budget = local["softcap"], local["budget"]
    _agree_on("vocab_parallel_linear_cross_entropy",
              dict(x=tuple(x.shape), dtype=str(x.dtype), reduction=reduction, ignore_index=int(ignore_index),
                   label_smoothing=float(label_smoothing), z_loss_weight=float(z_loss_weight), softcap=float(softcap),
                   return_argmax=bool(return_argmax), return_z_loss=bool(return_z_loss),
                   return_token_accuracy=bool(return_token_accuracy), return_lse=bool(return_lse),
                   bias=bias is not None, token_weights=token_weights is not None,
                   class_weights=class_weights is not None), group, dev)
    _same_content("vocab_parallel_linear_cross_entropy", dict(labels=labels, token_weights=token_weights), group, dev)
    slices = _gather_ints([vocab_start, v_box[0]], group, dev)
    opts = dict(reduction=reduction, label_smoothing=label_smoothing, z_loss_weight=z_loss_weight, softcap=softcap,
                w_layout=w_layout, implementation=implementation, memory_budget=budget)
    vt_box: List[int] = []

    def check_all():  # the slices, the labels and everything the kernel would refuse, before data moves
        vt_box.append(_check_vocab_slices(slices))
        _check_labels(labels[labels != ignore_index], vt_box[0])
        _check_kernel(x, w_local, labels, bias, token_weights, class_weights, opts, vt_box[0], return_argmax)
    _checked(check_all, group, dev)
    vt = vt_box[0]
    cw_full = None
    if class_weights is not None:
        cw_full = _gather_ragged(class_weights.to(torch.float32).contiguous(), [int(n) for _, n in slices.tolist()], group)
    o = dict(group=group, vocab_start=int(vocab_start), vocab_total=vt, class_weights_full=cw_full, reduction=reduction,
             ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss_weight=z_loss_weight, softcap=softcap,
             w_layout=w_layout, return_argmax=return_argmax, return_z_loss=return_z_loss,
             return_token_accuracy=return_token_accuracy, return_lse=return_lse, implementation=implementation,
             memory_budget=budget)
    out = _VocabParallelLCE.apply(x, w_local, bias, labels, token_weights, None, o)
    return out[0] if len(out) == 1 else out


def _check_kernel(x, w, labels, bias, token_weights, class_weights, opts: dict, vt: int, argmax: bool) -> None:
    """The kernel's own validation of the partial-form call, from metadata (no data is read)."""
    k = KERNELS["linear_cross_entropy"]
    tensors = dict(x=x, w=w, labels=labels.to(torch.int64), bias=bias, token_weights=token_weights,
                   class_weights=None if class_weights is None else torch.empty(vt, dtype=torch.float32))
    metas = {n: (dtype_name(t.dtype), list(t.shape), list(t.stride())) for n, t in tensors.items() if t is not None}
    options = {n: v for n, v in _lce_options(dict(opts), vt, argmax).items()
               if n not in ("implementation", "memory_budget")}
    _ext.outputs(k.name, "forward", metas, k.option_texts(options))


def _local_vocab(x, w, layout: str) -> int:
    h = x.shape[-1]
    if w.dim() != 2:
        raise ValueError(f"w_local must be 2-D, got {tuple(w.shape)}")
    if layout == "vh" or (layout == "auto" and w.shape[1] == h and w.shape[0] != h):
        return int(w.shape[0])
    if layout == "hv" or (layout == "auto" and w.shape[0] == h):
        return int(w.shape[1])
    raise ValueError(f"w_local {tuple(w.shape)} does not match H={h} in layout {layout!r}")


def _check_labels(kept, vt: int) -> None:
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= vt):
        raise ValueError(f"labels must lie in [0, V={vt}) or equal ignore_index, got [{int(kept.min())}, {int(kept.max())}]")
