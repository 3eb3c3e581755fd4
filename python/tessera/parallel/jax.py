"""JAX compositions of Tessera's kernels, for use inside ``jax.shard_map``.

    import tessera.parallel.jax as tpj
    def layer(x, ids, w_local):                     # per device: tokens [T_d, K], experts [E_d, K, N]
        return tpj.expert_parallel_grouped_matmul(x, ids, w_local, num_experts=E, axis_name="ep")
    out = jax.jit(jax.shard_map(layer, mesh=mesh, in_specs=(P("ep"), P("ep"), P("ep")), out_specs=P("ep")))(x, ids, w)

Works under jit and grad; equals the single-device layer.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import jax as tj
from .._registry import memory_budget_bytes, older_keyword
from . import _vocab

__all__ = ["expert_parallel_grouped_matmul", "context_parallel_attention", "context_parallel_paged_decode",
           "vocab_parallel_linear_cross_entropy"]


def _dx_cotangent(dx_share, xx, axis_name):
    """x's cotangent from this device's share of dx (its vocabulary slice's). x the same on every
    device of the vocab axis (the usual LM head, or JAX's types unchecked: check_vma off): the
    shares are summed. x varying over it (sequence parallelism: rows all-gathered over the axis
    just before the head): the share is this copy's cotangent and the gather's transpose sums
    them; summing here too counted each share once per device (dx 2x at 2 devices, a review)."""
    axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    shared = tuple(a for a in axes if a not in tj._varying_axes(xx))
    return tj._varying_like(jax.lax.psum(dx_share, shared) if shared else dx_share, xx)


def expert_parallel_grouped_matmul(x, expert_ids, w_local, *, num_experts: int, axis_name: str,
                                   transpose_rhs: bool = False, implementation: Optional[str] = None,
                                   frozen=()):
    """out[t] = x[t] · W[expert_ids[t]] with the experts sharded over the mesh axis ``axis_name``.

    Per device: x [T_d, K] and expert_ids [T_d] (its tokens; top-1 routing), w_local [E_d, K, N]
    (or [E_d, N, K] with transpose_rhs) = experts [i·E_d, (i+1)·E_d) on the device of axis index
    i, E_d = num_experts / axis size. The tokens are all-gathered and sorted by expert (the same
    order on every device); a device rolls its experts' rows to the front, runs one
    ``grouped_matmul`` over its E_d group sizes (the rows past them come back zero), rolls them
    back, and a reduce-scatter (``psum_scatter``) returns every device its tokens' rows.
    Communication per device: T·K in, T·N out (T all tokens) — simple and shape-static; a
    ``ragged_all_to_all`` dispatch would move only the routed rows. Returns [T_d, N].

    frozen: inputs treated as constants ("w_local", "x", both, as a comma list or a sequence): a
    zero gradient, and its work left out of the backward — frozen experts (LoRA on the experts'
    inputs) cost no tgmm; a frozen x costs no gmm for its gradient and none of the gradient's
    reduce-scatter / all-gather transposes.
    """
    frozen_names = _ep_frozen(frozen)
    e_local = w_local.shape[0]
    if x.ndim != 2 or expert_ids.shape != x.shape[:1]:
        raise ValueError(f"x must be [T, K] and expert_ids [T], got {x.shape} and {expert_ids.shape}")
    if e_local * jax.lax.axis_size(axis_name) != num_experts:
        raise ValueError(f"w_local holds {e_local} experts per device, {jax.lax.axis_size(axis_name)} devices: "
                         f"not num_experts={num_experts}")
    if "x" in frozen_names:  # nothing flows back through the gather either
        x = jax.lax.stop_gradient(x)
    x_all = jax.lax.all_gather(x, axis_name, tiled=True)
    ids = jax.lax.all_gather(expert_ids.astype(jnp.int32), axis_name, tiled=True)
    order = jnp.argsort(ids, stable=True)
    counts = jnp.bincount(ids, length=num_experts).astype(jnp.int32)
    first = jax.lax.axis_index(axis_name) * e_local
    row0 = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts)])[first]
    sizes = jax.lax.dynamic_slice(counts, (first,), (e_local,))
    rows = jnp.roll(x_all[order], -row0, axis=0)
    kernel_frozen = tuple(k for n, k in (("x", "lhs"), ("w_local", "rhs")) if n in frozen_names)
    y = tj.grouped_matmul(rows, w_local, sizes, transpose_rhs=transpose_rhs, implementation=implementation,
                          frozen=kernel_frozen)
    y = jnp.roll(y, row0, axis=0)
    y_tokens = jnp.zeros_like(y).at[order].set(y)  # rows back in token order; others' experts are 0
    return jax.lax.psum_scatter(y_tokens, axis_name, scatter_dimension=0, tiled=True)


def _ep_frozen(frozen) -> tuple:
    """expert_parallel_grouped_matmul's frozen= as a tuple of its input names."""
    names = [n.strip() for n in frozen.split(",") if n.strip()] if isinstance(frozen, str) else list(frozen or ())
    for n in names:
        if n not in ("x", "w_local"):
            raise ValueError(f"expert_parallel_grouped_matmul: frozen={n!r} is not an input whose gradient can be "
                             "skipped (frozen: x, w_local)")
    return tuple(sorted(set(names)))


def context_parallel_attention(q, k, v, *, axis_name: str, causal: bool = False, window_left: int = -1,
                               scale: float = 0.0, softcap: float = 0.0, implementation: Optional[str] = None):
    """Attention over a sequence sharded contiguously along the mesh axis ``axis_name``.

    Per device: q [B, S_d, Hq, D], k [B, S_d, Hkv, D], v [B, S_d, Hkv, Dv], the positions
    [i·S_d, (i+1)·S_d) on the device of axis index i. Keys and values are all-gathered. Shapes are
    static, so with ``causal`` the gathered keys are rolled right by S − (i+1)·S_d: the device's
    last position lands at the end, where ``attention``'s bottom-right alignment puts its last
    query, and the keys after it (rolled to the front) are masked out with segment ids. The causal
    mask and a left window are then exactly the single-device ones. The gradients of k and v are
    summed over the devices (the transpose of the all-gather). Returns this device's o
    [B, S_d, Hq, Dv]; works under jit and grad.
    """
    if not causal and window_left >= 0:
        raise ValueError("context_parallel_attention: a window needs causal=True here")
    k_all = jax.lax.all_gather(k, axis_name, axis=1, tiled=True)
    v_all = jax.lax.all_gather(v, axis_name, axis=1, tiled=True)
    opts = dict(scale=scale, softcap=softcap, implementation=implementation)
    if not causal:
        return tj.attention(q, k_all, v_all, **opts)
    b, s_local = q.shape[0], q.shape[1]
    s = k_all.shape[1]
    shift = s - (jax.lax.axis_index(axis_name) + 1) * s_local
    k_all, v_all = jnp.roll(k_all, shift, axis=1), jnp.roll(v_all, shift, axis=1)
    seg_k = jnp.broadcast_to((jnp.arange(s) >= shift).astype(jnp.int32), (b, s))
    seg_q = jnp.ones((b, s_local), jnp.int32)
    return tj.attention(q, k_all, v_all, segment_ids_q=seg_q, segment_ids_k=seg_k, causal=True,
                        window_left=window_left, **opts)


def context_parallel_paged_decode(q, k_cache, v_cache, page_table, kv_lens, cu_q_lens, *, axis_name: str,
                                  sinks=None, sink_index: int = 0, scale: Optional[float] = None,
                                  softcap: float = 0.0, return_lse: bool = False,
                                  implementation: Optional[str] = None, k_scale: float = 1.0, v_scale: float = 1.0):
    """Decode over a paged KV cache whose keys are sharded along the mesh axis ``axis_name``
    (vLLM's decode context parallelism; ``tessera.parallel.torch.context_parallel_paged_decode``).

    Per device: the same decode rows q [T, Hq, D] and cu_q_lens [N + 1] (at most one query per
    sequence), and the device's share of every sequence's keys: its cache (k_cache [P_d,
    page_size, Hkv, D], v_cache [P_d, page_size, Hkv, Dv], P_d >= 1: shapes are static and the
    same on every device), page_table [N, max_pages_d] with the device's page ids and kv_lens [N]
    (0 where it holds none of a sequence); the shares of a sequence together hold all its keys,
    split any way. Each device runs paged_attention on its share, then the partials merge by lse
    (a pmax and two psums). ``sinks`` [Hq] enter on the device of axis index ``sink_index`` only
    (the others pass −inf sinks, which take nothing). Under shard_map the lengths are traced, so a
    sequence with q_len > 1 cannot be refused: its rows come back NaN (or the kernel refuses the
    call where a device holds fewer of its keys than q_len). Returns o [T, Hq, Dv] in
    q's dtype (and lse [T, Hq] f32 with return_lse), the same on every device. Forward only. An
    f8e4m3 cache (jnp.float8_e4m3fn) takes its ``k_scale`` and ``v_scale``.
    """
    if not 0 <= sink_index < jax.lax.axis_size(axis_name):
        raise ValueError(f"context_parallel_paged_decode: sink_index={sink_index} is not an index of axis "
                         f"{axis_name!r} [0, {jax.lax.axis_size(axis_name)})")
    T = q.shape[0]
    q_lens = cu_q_lens[1:] - cu_q_lens[:-1]
    # The kernel wants q_len <= kv_len: a sequence with no key here runs on one stand-in key
    # (page 0, slot 0) whose result is replaced by the empty partial (o = 0, lse = the sink or −inf).
    empty = (kv_lens == 0) & (q_lens > 0)
    table = page_table.at[:, 0].set(jnp.where(empty, 0, page_table[:, 0]))
    lens = jnp.where(empty, 1, kv_lens).astype(kv_lens.dtype)
    if sinks is not None:
        sinks = jnp.where(jax.lax.axis_index(axis_name) == sink_index, sinks, -jnp.inf).astype(jnp.float32)
    opts = dict(softcap=softcap, implementation=implementation, k_scale=k_scale, v_scale=v_scale)
    if scale is not None:
        opts["scale"] = scale
    o, lse = tj.paged_attention(q, k_cache, v_cache, table, lens, cu_q_lens, sinks=sinks, return_lse=True, **opts)
    rows = jnp.repeat(empty, q_lens, total_repeat_length=T)[:, None]  # [T, 1]
    o = jnp.where(rows[..., None], 0.0, o.astype(jnp.float32))
    lse = jnp.where(rows, -jnp.inf if sinks is None else sinks[None, :], lse)
    m = jax.lax.pmax(lse, axis_name)
    m = jnp.where(jnp.isneginf(m), 0.0, m)  # rows nobody saw: weights exp(−inf) = 0; NaN propagates
    w = jnp.exp(lse - m)
    total = jax.lax.psum(w, axis_name)
    nobody = total == 0
    out = jax.lax.psum(w[..., None] * o, axis_name) / jnp.where(nobody, 1.0, total)[..., None]
    lse = jnp.where(nobody, -jnp.inf, m + jnp.log(jnp.where(nobody, 1.0, total)))
    prefill = jnp.repeat(q_lens > 1, q_lens, total_repeat_length=T)[:, None]  # not decode rows: NaN
    out = jnp.where(prefill[..., None], jnp.nan, out).astype(q.dtype)
    lse = jnp.where(prefill, jnp.nan, lse)
    return (out, lse) if return_lse else out


# ---- vocab-parallel linear cross-entropy ----

_REL_IGNORE = -(2 ** 31) + 1  # relative labels' ignore value (int32: JAX's default integers)


def _local_vocab(x, w, layout: str) -> int:
    h = x.shape[-1]
    if layout == "vh" or (layout == "auto" and w.shape[1] == h and w.shape[0] != h):
        return w.shape[0]
    if layout == "hv" or (layout == "auto" and w.shape[0] == h):
        return w.shape[1]
    raise ValueError(f"w_local {w.shape} does not match H={h} in layout {layout!r}")


def _zero_cotangent(a):
    """A zero cotangent for a non-differentiable argument (float0 for integers and booleans)."""
    if jnp.issubdtype(a.dtype, jnp.inexact):
        return jnp.zeros_like(a)
    return np.zeros(a.shape, dtype=jax.dtypes.float0)


def vocab_parallel_linear_cross_entropy(x, w_local, labels, *, vocab_start, axis_name: str, bias=None,
                                        token_weights=None, class_weights=None, reduction: str = "mean",
                                        ignore_index: int = -100, label_smoothing: float = 0.0,
                                        z_loss_weight: float = 0.0, softcap: float = 0.0, w_layout: str = "auto",
                                        return_argmax: bool = False, return_z_loss: bool = False,
                                        return_token_accuracy: bool = False, return_lse: bool = False,
                                        implementation: Optional[str] = None, memory_budget: Optional[int] = None,
                                        frozen=(), soft_cap: Optional[float] = None):
    """``tessera.jax.linear_cross_entropy`` with the classifier split along the mesh axis
    ``axis_name`` (inside ``shard_map``): w_local holds classes [vocab_start, vocab_start + V_d) of
    V = V_d × axis size (``vocab_start`` may be traced, e.g. ``lax.axis_index("tp") * V_d``); bias
    and class_weights are the matching slices, x / labels / token_weights the same on every
    device. The partial form on each slice, a pmax and a psum of three floats per token, and a
    psum of dx in the VJP. jit and grad; same results and return order as one device. frozen:
    inputs among x, w, bias treated as constants, their gradients skipped (as on one device)."""
    softcap = older_keyword("linear_cross_entropy", "softcap", softcap, soft_cap, 0.0)  # the older spelling
    frozen_names = tj._frozen_of(tj.KERNELS["linear_cross_entropy"], frozen)
    vt = _local_vocab(x, w_local, w_layout) * jax.lax.axis_size(axis_name)
    valid = labels != ignore_index
    rel = jnp.where(valid, labels.astype(jnp.int32) - vocab_start, _REL_IGNORE)
    cw_full = None
    if class_weights is not None:  # every slice's weights, the same on every device (a psum: typed invariant)
        placed = jax.lax.dynamic_update_slice(jnp.zeros(vt, jnp.float32), class_weights.astype(jnp.float32),
                                              (vocab_start,))
        cw_full = jax.lax.psum(placed, axis_name)
    cw_rot = None if cw_full is None else jnp.roll(cw_full, -vocab_start)
    want_argmax = return_argmax or return_token_accuracy
    opts = dict(reduction=reduction, ignore_index=_REL_IGNORE, label_smoothing=label_smoothing,
                z_loss_weight=z_loss_weight, softcap=softcap, w_layout=w_layout, vocab_total=vt)
    tw = jnp.ones(labels.shape, jnp.float32) if token_weights is None else token_weights.astype(jnp.float32)
    sigma_y = 1.0 if cw_full is None else cw_full[jnp.where(valid, labels, 0)]
    weight = jnp.where(valid, tw * sigma_y, 0.0)
    sigma_sum = float(vt) if cw_full is None else cw_full.sum()
    # Everything traced goes through the arguments: a custom_vjp must not close over tracers.
    aux = dict(labels=rel, token_weights=token_weights, class_weights=cw_rot, valid=valid, weight=weight, tw=tw,
               sigma_sum=jnp.asarray(sigma_sum, jnp.float32), start=jnp.asarray(vocab_start, jnp.int32))
    impl = implementation or ""
    budget = memory_budget_bytes(memory_budget, "linear_cross_entropy")

    def stats(xx, ww, bb, a):
        t = dict(x=xx, w=ww, bias=bb, labels=a["labels"], token_weights=a["token_weights"],
                 class_weights=a["class_weights"])
        out = tj.call("linear_cross_entropy", "forward", t, implementation=impl, memory_budget=budget,
                      return_argmax=want_argmax, **opts)
        m = jax.lax.pmax(out["lse"], axis_name)
        sums = jax.lax.psum(jnp.stack([jnp.exp(out["lse"] - m), out["label_logit"], out["logit_sum"]]), axis_name)
        return m + jnp.log(sums[0]), sums[1], sums[2], out

    def loss_of(lse, zy, sz, a):
        per_token, z_part = _vocab.token_losses(jnp.where, lse, zy, sz, a["valid"], a["weight"], a["tw"],
                                                smoothing=label_smoothing, z_loss=z_loss_weight, vocab=vt,
                                                sigma_sum=a["sigma_sum"])
        return _vocab.reduce(jnp.where, per_token, a["weight"], reduction), z_part

    def outputs(xx, ww, bb, a):
        lse, zy, sz, out = stats(xx, ww, bb, a)
        loss = loss_of(lse, zy, sz, a)[0]
        if want_argmax:
            return loss, lse, zy, sz, out["argmax"], out["max_logit"]
        return loss, lse, zy, sz

    # frozen inputs: a zero cotangent, their gradients skipped in the backward (a frozen x also
    # drops dx's all-reduce, on every device alike: frozen is static, the same SPMD program).
    skip = tuple("d" + n for n in frozen_names)

    @jax.custom_vjp
    def loss_fn(xx, ww, bb, a):
        return outputs(xx, ww, bb, a)

    def fwd(xx, ww, bb, a):
        outs = outputs(xx, ww, bb, a)
        return outs, (xx, ww, bb, a, outs[1])

    def bwd(res, gs):  # only the loss carries a gradient: the statistics' cotangents are dropped
        xx, ww, bb, a, lse = res
        t = dict(x=xx, w=ww, bias=bb, labels=a["labels"], token_weights=a["token_weights"],
                 class_weights=a["class_weights"], grad_loss=jnp.asarray(gs[0], jnp.float32), lse=lse)
        grads = tj.call("linear_cross_entropy", "backward", t, implementation=impl, memory_budget=budget,
                        skip=tuple(n for n in skip if n != "dbias" or bb is not None), **opts)
        zeros = jax.tree_util.tree_map(_zero_cotangent, a)
        # Each cotangent varies over its primal's mesh axes only: on a data x tensor parallel mesh
        # dw and dbias come back varying over the data axes too and are summed over them (the
        # weights are the same on every data shard), as tessera.jax does for its own calls.
        dx = None if "dx" in skip else _dx_cotangent(grads["dx"], xx, axis_name)
        dw = None if "dw" in skip else tj._varying_like(grads["dw"], ww)
        db = None if bb is None or "dbias" in skip else tj._varying_like(grads["dbias"], bb)
        return dx, dw, db, zeros

    loss_fn.defvjp(fwd, bwd)
    outs = loss_fn(x, w_local, bias, aux)
    loss = outs[0]
    if not (return_argmax or return_z_loss or return_token_accuracy or return_lse):
        return loss
    lse, zy, sz = (jax.lax.stop_gradient(o) for o in outs[1:4])
    raw = {"argmax": outs[4], "max_logit": jax.lax.stop_gradient(outs[5])} if want_argmax else {}
    extras = []
    if want_argmax:
        best = jax.lax.pmax(raw["max_logit"], axis_name)
        cand = raw["argmax"] + vocab_start
        idx = jax.lax.pmin(jnp.where(raw["max_logit"] == best, cand, jnp.iinfo(cand.dtype).max), axis_name)
        if return_argmax:
            extras.append(idx)
    if return_z_loss:
        extras.append(_vocab.reduce(jnp.where, loss_of(lse, zy, sz, aux)[1], weight, reduction))
    if return_token_accuracy:
        kept = valid.sum()
        extras.append(jnp.where(kept == 0, 0.0, ((idx == labels) & valid).sum() / jnp.maximum(kept, 1)).astype(jnp.float32))
    if return_lse:
        extras.append(lse)
    return (loss, *extras)
