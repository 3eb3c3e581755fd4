"""Run by test_parallel_jax.py in a fresh process: XLA_FLAGS must give 4 host devices before JAX
starts. Checks expert-parallel grouped matmul on 2 and 4 devices against the single-device math."""
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import tessera.jax as tj  # noqa: E402
import tessera.parallel.jax as tpj  # noqa: E402

E, K, N, T = 8, 6, 5, 24


def problem(seed=0):
    g = np.random.default_rng(seed)
    ids = g.integers(0, E - 1, T)  # expert E-1 gets no tokens
    ids[:6] = 2                    # a crowded expert
    return (g.standard_normal((T, K)).astype(np.float32), ids.astype(np.int32),
            g.standard_normal((E, K, N)).astype(np.float32), g.standard_normal((T, N)).astype(np.float32))


def check(devices: int) -> None:
    x, ids, w, dout = problem()
    mesh = Mesh(np.array(jax.devices()[:devices]), ("ep",))
    layer = jax.shard_map(lambda a, b, c: tpj.expert_parallel_grouped_matmul(a, b, c, num_experts=E, axis_name="ep"),
                          mesh=mesh, in_specs=(P("ep"), P("ep"), P("ep")), out_specs=P("ep"))
    loss = jax.jit(lambda a, c: jnp.sum(layer(a, ids, c) * dout))
    out = jax.jit(layer)(x, ids, w)
    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    w64 = w.astype(np.float64)[ids]
    np.testing.assert_allclose(np.asarray(out), np.einsum("tk,tkn->tn", x.astype(np.float64), w64), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(dx), np.einsum("tn,tkn->tk", dout.astype(np.float64), w64), rtol=1e-5, atol=1e-5)
    want = np.zeros((E, K, N))
    np.add.at(want, ids, np.einsum("tk,tn->tkn", x.astype(np.float64), dout.astype(np.float64)))
    np.testing.assert_allclose(np.asarray(dw), want, rtol=1e-5, atol=1e-5)
    assert not np.any(np.asarray(dw)[E - 1]), "an expert with no tokens gets no gradient"


def check_replicated_weights(devices: int) -> None:
    """Data parallel: tokens sharded, the experts replicated (P()): the weights' gradient is the sum
    over the devices (tessera.jax's VJP sums a replicated primal's cotangent)."""
    x, ids, w, dout = problem(1)
    sizes = np.bincount(ids, minlength=E).astype(np.int32)
    mesh = Mesh(np.array(jax.devices()[:devices]), ("dp",))
    order = np.argsort(ids, kind="stable")
    xs, ds = x[order], dout[order]
    per = T // devices

    def local(a, c, d):  # each device: its slice of the sorted rows, group sizes of that slice
        i = jax.lax.axis_index("dp")
        first = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(jnp.asarray(sizes))])
        lo, hi = i * per, (i + 1) * per
        mine = jnp.clip(jnp.minimum(first[1:], hi) - jnp.maximum(first[:-1], lo), 0).astype(jnp.int32)
        return jax.lax.psum(jnp.sum(tj.grouped_matmul(a, c, mine) * d), "dp")

    f = jax.shard_map(local, mesh=mesh, in_specs=(P("dp"), P(), P("dp")), out_specs=P())
    dw = jax.jit(jax.grad(f, argnums=1))(xs, w, ds)
    want = np.zeros((E, K, N))
    np.add.at(want, ids, np.einsum("tk,tn->tkn", x.astype(np.float64), dout.astype(np.float64)))
    np.testing.assert_allclose(np.asarray(dw), want, rtol=1e-5, atol=1e-5)


def check_context_parallel(devices: int, causal: bool, window_left: int) -> None:
    """Attention over 12 positions sharded over the devices: o and dq, dk, dv against one device."""
    g = np.random.default_rng(5)
    q, k, v, do = (g.standard_normal((2, 12, h, 8)).astype(np.float32) for h in (4, 2, 2, 4))
    mesh = Mesh(np.array(jax.devices()[:devices]), ("cp",))
    spec = P(None, "cp")
    sharded = jax.shard_map(lambda a, b, c: tpj.context_parallel_attention(a, b, c, axis_name="cp", causal=causal,
                                                                          window_left=window_left),
                            mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec)
    whole = lambda a, b, c: tj.attention(a, b, c, causal=causal, window_left=window_left)  # noqa: E731
    o, o_ref = jax.jit(sharded)(q, k, v), whole(q, k, v)
    np.testing.assert_allclose(np.asarray(o), np.asarray(o_ref), rtol=2e-5, atol=2e-5)
    grads = jax.jit(jax.grad(lambda a, b, c: jnp.sum(sharded(a, b, c) * do), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda a, b, c: jnp.sum(whole(a, b, c) * do), argnums=(0, 1, 2))(q, k, v)
    for got, ref in zip(grads, want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-5, atol=2e-5)


if __name__ == "__main__":
    for d in (int(a) for a in sys.argv[1:]) if len(sys.argv) > 1 else (2, 4):
        check(d)
        check_replicated_weights(d)
        for causal, window in ((False, -1), (True, -1), (True, 3)):
            check_context_parallel(d, causal, window)
    print("ok", file=sys.stderr)
