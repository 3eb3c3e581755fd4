"""Run by test_parallel_jax.py in a fresh process: XLA_FLAGS must give 4 host devices before JAX
starts. Checks expert-parallel grouped matmul, context-parallel attention, decode context
parallelism over a paged cache and vocab-parallel linear cross-entropy on 2 and 4 devices against
the single-device math."""
import contextlib
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


@contextlib.contextmanager
def ffi_skips():
    """Every FFI call made inside, as (pass, sorted skip list), through tessera.jax's _ffi."""
    seen, real = [], tj._ffi

    def spy(k, pass_, tensors, options, ex, skip=()):
        seen.append((pass_, tuple(sorted(skip))))
        return real(k, pass_, tensors, options, ex, skip)

    tj._ffi = spy
    try:
        yield seen
    finally:
        tj._ffi = real


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

    # frozen experts: the backward skips drhs, dx the same bits; a frozen x skips dlhs, dw the same.
    def frozen_loss(fr):
        lay = jax.shard_map(lambda a, b, c: tpj.expert_parallel_grouped_matmul(a, b, c, num_experts=E, axis_name="ep",
                                                                               frozen=fr),
                            mesh=mesh, in_specs=(P("ep"), P("ep"), P("ep")), out_specs=P("ep"))
        return lambda a, c: jnp.sum(lay(a, ids, c) * dout)

    with ffi_skips() as seen:
        dx_f = jax.jit(jax.grad(frozen_loss("w_local"), argnums=0))(x, w)
        dw_f = jax.jit(jax.grad(frozen_loss(("x",)), argnums=1))(x, w)
        dx_0 = jax.jit(jax.grad(frozen_loss("x, w_local"), argnums=0))(x, w)
    assert ("backward", ("drhs",)) in seen and ("backward", ("dlhs",)) in seen, seen
    np.testing.assert_array_equal(np.asarray(dx_f), np.asarray(dx))
    np.testing.assert_array_equal(np.asarray(dw_f), np.asarray(dw))
    assert not np.any(np.asarray(dx_0)), "a frozen x has a zero gradient"
    try:
        frozen_loss("w")(x, w)
        raise AssertionError("frozen='w' was accepted")
    except ValueError as e:
        assert "frozen='w' is not an input whose gradient can be skipped (frozen: x, w_local)" in str(e), e


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


def check_paged_decode(devices: int) -> None:
    """Decode rows over a paged cache whose pages are dealt to the devices (page j of sequence s to
    device (j + s) % devices, each device a cache of its own pages with local ids, padded to the
    same page count; at 4 devices some hold none of a short sequence), sinks on the last device:
    o and lse against one device, under jit; a q_len-2 sequence comes back NaN."""
    g = np.random.default_rng(11)
    ps, kv_lens, q_lens, Hq, Hkv, D, Dv = 4, [37, 5, 3, 20], [1, 1, 0, 1], 4, 2, 8, 6
    pages = [-(-n // ps) for n in kv_lens]
    table = np.full((len(kv_lens), max(pages)), -1, np.int32)
    starts = np.cumsum([0] + pages)
    for s, n in enumerate(pages):
        table[s, :n] = np.arange(starts[s], starts[s] + n)
    P_ = int(starts[-1])
    k = g.standard_normal((P_, ps, Hkv, D)).astype(np.float32)
    v = g.standard_normal((P_, ps, Hkv, Dv)).astype(np.float32)
    sinks = g.standard_normal(Hq).astype(np.float32)
    owned = [[] for _ in range(devices)]  # global page ids of each device, in local order
    tables = np.full((devices,) + table.shape, -1, np.int32)
    lens = np.zeros((devices, len(kv_lens)), np.int32)
    for s, n in enumerate(kv_lens):
        for j in range(pages[s]):
            d = (j + s) % devices
            tables[d, s, int((tables[d, s] >= 0).sum())] = len(owned[d])
            owned[d].append(int(table[s, j]))
            lens[d, s] += min(ps, n - j * ps)
    most = max(len(o) for o in owned)
    pad = [o + [0] * (most - len(o)) for o in owned]  # unused pages: never read
    ks = np.concatenate([k[p] for p in pad])  # [devices · most, ...]: device d's cache is block d
    vs = np.concatenate([v[p] for p in pad])
    mesh = Mesh(np.array(jax.devices()[:devices]), ("cp",))

    def run(q, cu):
        def local(qq, kk, vv, tt, ll, cc, ss):
            return tpj.context_parallel_paged_decode(qq, kk, vv, tt[0], ll[0], cc, sinks=ss, sink_index=devices - 1,
                                                     axis_name="cp", return_lse=True)
        sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(), P("cp"), P("cp"), P("cp"), P("cp"), P(), P()),
                                out_specs=(P(), P()))
        return jax.jit(sharded)(q, ks, vs, tables, lens, cu, sinks)

    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = g.standard_normal((int(cu[-1]), Hq, D)).astype(np.float32)
    o, lse = run(q, cu)
    o_ref, lse_ref = tj.paged_attention(q, k, v, table, np.array(kv_lens, np.int32), cu, sinks=sinks, return_lse=True)
    np.testing.assert_allclose(np.asarray(o), np.asarray(o_ref), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(lse), np.asarray(lse_ref), rtol=2e-5, atol=2e-5)
    # An f8e4m3 cache with its scales (every device's share dequantized alike).
    k8, v8 = (ks / 0.02).astype(jnp.float8_e4m3fn), (vs / 0.05).astype(jnp.float8_e4m3fn)
    mesh_local = jax.shard_map(
        lambda qq, kk, vv, tt, ll, cc, ss: tpj.context_parallel_paged_decode(
            qq, kk, vv, tt[0], ll[0], cc, sinks=ss, sink_index=devices - 1, axis_name="cp", k_scale=0.02, v_scale=0.05),
        mesh=mesh, in_specs=(P(), P("cp"), P("cp"), P("cp"), P("cp"), P(), P()), out_specs=P())
    o8 = jax.jit(mesh_local)(q, k8, v8, tables, lens, cu, sinks)
    o8_ref = tj.paged_attention(q, (k / 0.02).astype(jnp.float8_e4m3fn), (v / 0.05).astype(jnp.float8_e4m3fn), table,
                                np.array(kv_lens, np.int32), cu, sinks=sinks, k_scale=0.02, v_scale=0.05)
    np.testing.assert_allclose(np.asarray(o8), np.asarray(o8_ref), rtol=2e-5, atol=2e-5)
    # Sequence 0 with two rows (every device holds >= 2 of its keys): not decode rows, so NaN.
    cu2 = np.array([0, 2, 3, 3, 4], np.int32)
    o2, lse2 = run(np.concatenate([q[:1], q]), cu2)
    assert np.isnan(np.asarray(o2)[:2]).all() and np.isnan(np.asarray(lse2)[:2]).all()
    np.testing.assert_allclose(np.asarray(o2)[2:], np.asarray(o_ref)[1:], rtol=2e-5, atol=2e-5)


LCE_CASES = [
    dict(reduction="mean", memory_budget=1 << 20),  # taken by the vocab-parallel call too
    dict(reduction="none", label_smoothing=0.1, z_loss_weight=1e-2, softcap=3.0, bias=True),
    dict(reduction="sum", class_weights=True, token_weights=True, label_smoothing=0.2, return_argmax=True,
         return_z_loss=True, return_token_accuracy=True, return_lse=True),
]


def check_vocab_parallel(devices: int, case: dict) -> None:
    """The classifier's 12 classes split over the devices (vocab_start traced from axis_index):
    loss, extras and the gradients of x, w, bias against one device."""
    case = dict(case)
    g = np.random.default_rng(9)
    B, H, V = 10, 5, 12
    x = g.standard_normal((B, H)).astype(np.float32)
    w = g.standard_normal((V, H)).astype(np.float32)
    labels = np.array([3, 0, 11, -100, 5, 4, 7, 9, 1, 11], np.int32)
    bias = g.standard_normal(V).astype(np.float32) if case.pop("bias", False) else None
    cw = (g.random(V) + 0.25).astype(np.float32) if case.pop("class_weights", False) else None
    tw = (g.random(B) + 0.5).astype(np.float32) if case.pop("token_weights", False) else None
    vd = V // devices
    mesh = Mesh(np.array(jax.devices()[:devices]), ("tp",))
    b0 = np.zeros(V, np.float32) if bias is None else bias

    def sharded(xx, ww, bb, cc, frozen=()):
        def local(xl, wl, bl, cl):
            s = jax.lax.axis_index("tp") * vd
            return tj.linear_cross_entropy(xl, wl, labels, vocab_start=s, axis_name="tp",
                                           bias=None if bias is None else bl, token_weights=tw,
                                           class_weights=None if cw is None else cl, frozen=frozen, **case)
        return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("tp"), P("tp"), P("tp")), out_specs=P())(xx, ww, bb, cc)

    def whole(xx, ww, bb, cc):
        return tj.linear_cross_entropy(xx, ww, labels, bias=None if bias is None else bb, token_weights=tw,
                                       class_weights=None if cw is None else cc, **case)

    c0 = np.ones(V, np.float32) if cw is None else cw
    got, want = jax.jit(sharded)(x, w, b0, c0), whole(x, w, b0, c0)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

    def scalar(f, **kw):
        def s(xx, ww, bb):
            out = f(xx, ww, bb, c0, **kw)
            loss = out[0] if isinstance(out, tuple) else out
            return jnp.sum(loss * jnp.linspace(0.5, 1.5, loss.size).reshape(loss.shape))
        return s

    gs = jax.jit(jax.grad(scalar(sharded), argnums=(0, 1, 2)))(x, w, b0)
    gw = jax.grad(scalar(whole), argnums=(0, 1, 2))(x, w, b0)
    for a, b in zip(gs, gw):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)

    # A frozen classifier (frozen="w,bias"): each device's backward skips its dw slice and dbias,
    # dx is the same bits as with nothing frozen; a frozen x (head-only training) skips dx and
    # its all-reduce, dw the same bits.
    with ffi_skips() as seen:
        dx = jax.jit(jax.grad(scalar(sharded, frozen="w,bias"), argnums=0))(x, w, b0)
        dw = jax.jit(jax.grad(scalar(sharded, frozen="x"), argnums=1))(x, w, b0)
    want_skip = ("dw",) if bias is None else ("dbias", "dw")
    assert ("backward", want_skip) in seen, seen
    assert ("backward", ("dx",)) in seen, seen
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(gs[0]))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(gs[1]))


def check_vocab_parallel_sequence_parallel(devices: int) -> None:
    """Sequence parallelism: x's rows sharded over the vocab axis and all-gathered just before the
    head, so the head's x varies over the axis. dx summed the devices' shares and the gather's
    transpose summed them again: dx came back `devices` times too large (a review; loss and dw
    were right)."""
    g = np.random.default_rng(13)
    B, H, V = 8, 5, 12
    x = g.standard_normal((B, H)).astype(np.float32)
    w = g.standard_normal((V, H)).astype(np.float32)
    labels = np.array([3, 0, 11, -100, 5, 4, 7, 9], np.int32)
    mesh, vd = Mesh(np.array(jax.devices()[:devices]), ("tp",)), V // devices

    def sharded(xx, ww):
        def local(xl, wl):
            rows = jax.lax.all_gather(xl, "tp", tiled=True)
            return tj.linear_cross_entropy(rows, wl, labels, vocab_start=jax.lax.axis_index("tp") * vd,
                                           axis_name="tp", reduction="sum")
        return jax.shard_map(local, mesh=mesh, in_specs=(P("tp"), P("tp")), out_specs=P())(xx, ww)

    def whole(xx, ww):
        return tj.linear_cross_entropy(xx, ww, labels, reduction="sum")

    np.testing.assert_allclose(np.asarray(jax.jit(sharded)(x, w)), np.asarray(whole(x, w)), rtol=1e-5)
    gs = jax.jit(jax.grad(sharded, argnums=(0, 1)))(x, w)
    gw = jax.grad(whole, argnums=(0, 1))(x, w)
    for a, b in zip(gs, gw):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def check_vocab_parallel_2d() -> None:
    """A data x tensor parallel mesh (2 x 2): tokens split over dp, the vocabulary over tp; the
    gradients of the weights (the same on every data shard) are summed over dp. jax.grad failed
    here: dw came back varying over dp as well as tp."""
    g = np.random.default_rng(11)
    B, H, V = 12, 6, 16
    x = g.standard_normal((B, H)).astype(np.float32)
    w = g.standard_normal((V, H)).astype(np.float32)
    bias = g.standard_normal(V).astype(np.float32)
    labels = (np.arange(B) * 5 % V).astype(np.int32)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("dp", "tp"))

    def sharded(xx, ww, bb):
        def local(xl, wl, bl, yl):
            s = jax.lax.axis_index("tp") * (V // 2)
            loss = tj.linear_cross_entropy(xl, wl, yl, vocab_start=s, axis_name="tp", bias=bl, reduction="sum")
            return jax.lax.psum(loss, "dp")
        return jax.shard_map(local, mesh=mesh, in_specs=(P("dp"), P("tp"), P("tp"), P("dp")), out_specs=P())(
            xx, ww, bb, labels)

    def whole(xx, ww, bb):
        return tj.linear_cross_entropy(xx, ww, labels, bias=bb, reduction="sum")

    np.testing.assert_allclose(np.asarray(jax.jit(sharded)(x, w, bias)), np.asarray(whole(x, w, bias)), rtol=1e-5)
    gs = jax.jit(jax.grad(sharded, argnums=(0, 1, 2)))(x, w, bias)
    gw = jax.grad(whole, argnums=(0, 1, 2))(x, w, bias)
    for a, b in zip(gs, gw):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    for d in (int(a) for a in sys.argv[1:]) if len(sys.argv) > 1 else (2, 4):
        check(d)
        check_replicated_weights(d)
        for causal, window in ((False, -1), (True, -1), (True, 3)):
            check_context_parallel(d, causal, window)
        check_paged_decode(d)
        for case in LCE_CASES:
            print("vocab-parallel", d, case, file=sys.stderr)
            check_vocab_parallel(d, case)
        check_vocab_parallel_sequence_parallel(d)
    if len(jax.devices()) >= 4:
        check_vocab_parallel_2d()
    print("ok", file=sys.stderr)
