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

from .. import jax as tj

__all__ = ["expert_parallel_grouped_matmul", "context_parallel_attention"]


def expert_parallel_grouped_matmul(x, expert_ids, w_local, *, num_experts: int, axis_name: str,
                                   transpose_rhs: bool = False, implementation: Optional[str] = None):
    """out[t] = x[t] · W[expert_ids[t]] with the experts sharded over the mesh axis ``axis_name``.

    Per device: x [T_d, K] and expert_ids [T_d] (its tokens; top-1 routing), w_local [E_d, K, N]
    (or [E_d, N, K] with transpose_rhs) = experts [i·E_d, (i+1)·E_d) on the device of axis index
    i, E_d = num_experts / axis size. The tokens are all-gathered and sorted by expert (the same
    order on every device); a device rolls its experts' rows to the front, runs one
    ``grouped_matmul`` over its E_d group sizes (the rows past them come back zero), rolls them
    back, and a reduce-scatter (``psum_scatter``) returns every device its tokens' rows.
    Communication per device: T·K in, T·N out (T all tokens) — simple and shape-static; a
    ``ragged_all_to_all`` dispatch would move only the routed rows. Returns [T_d, N].
    """
    e_local = w_local.shape[0]
    if x.ndim != 2 or expert_ids.shape != x.shape[:1]:
        raise ValueError(f"x must be [T, K] and expert_ids [T], got {x.shape} and {expert_ids.shape}")
    if e_local * jax.lax.axis_size(axis_name) != num_experts:
        raise ValueError(f"w_local holds {e_local} experts per device, {jax.lax.axis_size(axis_name)} devices: "
                         f"not num_experts={num_experts}")
    x_all = jax.lax.all_gather(x, axis_name, tiled=True)
    ids = jax.lax.all_gather(expert_ids.astype(jnp.int32), axis_name, tiled=True)
    order = jnp.argsort(ids, stable=True)
    counts = jnp.bincount(ids, length=num_experts).astype(jnp.int32)
    first = jax.lax.axis_index(axis_name) * e_local
    row0 = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts)])[first]
    sizes = jax.lax.dynamic_slice(counts, (first,), (e_local,))
    rows = jnp.roll(x_all[order], -row0, axis=0)
    y = tj.grouped_matmul(rows, w_local, sizes, transpose_rhs=transpose_rhs, implementation=implementation)
    y = jnp.roll(y, row0, axis=0)
    y_tokens = jnp.zeros_like(y).at[order].set(y)  # rows back in token order; others' experts are 0
    return jax.lax.psum_scatter(y_tokens, axis_name, scatter_dimension=0, tiled=True)


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
