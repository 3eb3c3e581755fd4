"""tessera.attention from NumPy, PyTorch and JAX: values and gradients against the attention
written out with softmax (float64 NumPy, PyTorch's own autodiff, JAX's own autodiff), GQA,
causal with Sq != Sk, the saved o and lse, and errors."""
import numpy as np
import pytest

import tessera


def qkv(B=2, Sq=7, Sk=9, Hq=4, Hkv=2, D=8, Dv=6, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Sq, Hq, D)).astype(np.float32),
            rng.standard_normal((B, Sk, Hkv, D)).astype(np.float32),
            rng.standard_normal((B, Sk, Hkv, Dv)).astype(np.float32))


def expected(q, k, v, causal=False, softcap=0.0, scale=None):
    """o and lse in float64: scores, bottom-right causal mask, softmax, weighted values."""
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kk, vv = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * (scale or 1 / np.sqrt(D))
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if causal:
        i, j = np.arange(Sq)[:, None], np.arange(Sk)[None, :]
        s = np.where(j <= i + (Sk - Sq), s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    lse = (m + np.log(p.sum(-1, keepdims=True)))[..., 0]
    o = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vv)
    return o, lse


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_forward(impl, causal):
    q, k, v = qkv()
    o = tessera.attention(q, k, v, causal=causal, softcap=3.0, implementation=impl)
    want, lse = expected(q, k, v, causal=causal, softcap=3.0)
    assert o.shape == (2, 7, 4, 6) and o.dtype == np.float32
    np.testing.assert_allclose(o, want, rtol=2e-5, atol=2e-5)
    out = tessera.call("attention", "forward", {"q": q, "k": k, "v": v}, causal=causal, softcap=3.0)
    np.testing.assert_allclose(out["lse"], lse, rtol=2e-5, atol=2e-5)


def test_numpy_backward_with_and_without_the_saved_forward():
    q, k, v = qkv(seed=1)
    g = np.random.default_rng(2).standard_normal((2, 7, 4, 6)).astype(np.float32)
    fwd = tessera.call("attention", "forward", {"q": q, "k": k, "v": v}, causal=True)
    a = tessera.call("attention", "backward", {"q": q, "k": k, "v": v, "grad_o": g, "o": fwd["o"], "lse": fwd["lse"]},
                     causal=True)
    b = tessera.call("attention", "backward", {"q": q, "k": k, "v": v, "grad_o": g}, causal=True)
    for n in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(a[n], b[n])
    # Central differences of L = Σ o·g in float64 along one direction per input.
    rng = np.random.default_rng(3)
    for name, x in (("dq", q), ("dk", k), ("dv", v)):
        d = rng.standard_normal(x.shape)
        h = 1e-3

        def loss(t):
            args = {"q": q, "k": k, "v": v}
            args[name[1:]] = t
            return (expected(args["q"], args["k"], args["v"], causal=True)[0] * g).sum()

        fd = (loss(x + h * d) - loss(x - h * d)) / (2 * h)
        np.testing.assert_allclose((a[name] * d).sum(), fd, rtol=1e-4, atol=1e-4)


def test_deterministic_is_a_keyword_on_by_default():
    # deterministic=False lets cudnn take its non-deterministic backward; the cpu backward is
    # deterministic either way, so the bits are the same.
    q, k, v = qkv(seed=5)
    g = np.random.default_rng(6).standard_normal((2, 7, 4, 6)).astype(np.float32)
    args = {"q": q, "k": k, "v": v, "grad_o": g}
    a = tessera.call("attention", "backward", args, causal=True)
    b = tessera.call("attention", "backward", args, causal=True, deterministic=False)
    for n in ("dq", "dk", "dv"):
        np.testing.assert_array_equal(a[n], b[n])
    opt = {o.name: o for o in tessera.KERNELS["attention"].options}["deterministic"]
    assert opt.kind == "flag" and opt.default is True
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        tessera.attention(q, k, v, deterministic="no")


def test_numpy_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="not a multiple of Hkv"):
        tessera.attention(np.ascontiguousarray(q[:, :, :3]), k, v)
    with pytest.raises(TypeError):
        tessera.attention(q.astype(np.float64), k, v)


def test_torch_autograd_matches_sdpa():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(t).requires_grad_() for t in qkv(Hq=4, Hkv=4, Dv=8, seed=4))
    o = tessera.attention(q, k, v, causal=True)
    g = torch.linspace(-1, 1, o.numel()).reshape(o.shape)
    gq, gk, gv = torch.autograd.grad((o * g).sum(), (q, k, v))
    # SDPA is [B, H, S, D] and aligns causal top-left; Sq = 7 < Sk = 9 needs the bottom-right mask.
    i, j = torch.arange(7)[:, None], torch.arange(9)[None, :]
    mask = j <= i + 2
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    ref = ref.transpose(1, 2)
    rq, rk, rv = torch.autograd.grad((ref * g).sum(), (q, k, v))
    torch.testing.assert_close(o, ref, rtol=2e-5, atol=2e-5)
    for a, b in ((gq, rq), (gk, rk), (gv, rv)):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


def test_jax_jit_and_grad():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v = qkv(seed=5)
    g = np.random.default_rng(6).standard_normal((2, 7, 4, 6)).astype(np.float32)

    def ref(q, k, v):
        kk, vv = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
        s = jnp.einsum("bihd,bjhd->bhij", q, kk) / jnp.sqrt(8.0)
        s = jnp.where(jnp.arange(9)[None, :] <= jnp.arange(7)[:, None] + 2, s, -jnp.inf)
        return jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(s, axis=-1), vv)

    ours = jax.jit(jax.grad(lambda q, k, v: jnp.sum(tj.attention(q, k, v, causal=True) * g), argnums=(0, 1, 2)))
    theirs = jax.grad(lambda q, k, v: jnp.sum(ref(q, k, v) * g), argnums=(0, 1, 2))
    np.testing.assert_allclose(np.asarray(tj.attention(q, k, v, causal=True)), np.asarray(ref(q, k, v)),
                               rtol=2e-5, atol=2e-5)
    for a, b in zip(ours(q, k, v), theirs(q, k, v)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


# Two documents packed in each row (MaxText's bug: a JAX path that dropped the segment ids and
# let the documents attend to each other). Every binding must mask across documents: the result is
# each document run alone, and it differs from the unmasked call.
SEGMENTS = np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 2, 2]], dtype=np.int32)


def documents(seg):
    """(row, start, stop) of each document of each packed row."""
    out = []
    for b, row in enumerate(seg):
        edges = [0] + [i for i in range(1, len(row)) if row[i] != row[i - 1]] + [len(row)]
        out += [(b, s, e) for s, e in zip(edges[:-1], edges[1:])]
    return out


def test_numpy_segments_keep_packed_documents_apart():
    q, k, v = qkv(Sq=7, Sk=7, seed=7)
    for causal in (False, True):
        o = tessera.attention(q, k, v, segment_ids_q=SEGMENTS, segment_ids_k=SEGMENTS, causal=causal)
        for b, s, e in documents(SEGMENTS):
            want, _ = expected(q[b:b + 1, s:e], k[b:b + 1, s:e], v[b:b + 1, s:e], causal=causal)
            np.testing.assert_allclose(o[b:b + 1, s:e], want, rtol=2e-5, atol=2e-5)
        assert not np.allclose(o, tessera.attention(q, k, v, causal=causal), atol=1e-3)


def test_torch_segments_keep_packed_documents_apart():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(t).requires_grad_() for t in qkv(Sq=7, Sk=7, Hq=4, Hkv=4, Dv=8, seed=8))
    seg = torch.from_numpy(SEGMENTS)
    o = tessera.attention(q, k, v, segment_ids_q=seg, segment_ids_k=seg, causal=True)
    g = torch.linspace(-1, 1, o.numel()).reshape(o.shape)
    ours = torch.autograd.grad((o * g).sum(), (q, k, v))
    parts = []
    for b, s, e in documents(SEGMENTS):  # each document alone through SDPA ([B, H, S, D], causal)
        r = F.scaled_dot_product_attention(*(t[b:b + 1, s:e].transpose(1, 2) for t in (q, k, v)), is_causal=True)
        r = r.transpose(1, 2)
        parts.append(((r - o[b:b + 1, s:e]).detach().abs().max(), (r * g[b:b + 1, s:e]).sum()))
    assert max(float(d) for d, _ in parts) < 2e-5
    theirs = torch.autograd.grad(sum(l for _, l in parts), (q, k, v))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)
    unmasked = tessera.attention(q, k, v, causal=True)
    assert (unmasked - o).abs().max() > 1e-3


def test_jax_segments_keep_packed_documents_apart_under_jit_and_grad():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v = qkv(Sq=7, Sk=7, seed=9)
    g = np.random.default_rng(10).standard_normal((2, 7, 4, 6)).astype(np.float32)
    seg = jnp.asarray(SEGMENTS)

    def ref(q, k, v):  # the mask written out: same document and causal
        kk, vv = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
        s = jnp.einsum("bihd,bjhd->bhij", q, kk) / jnp.sqrt(8.0)
        keep = (seg[:, :, None] == seg[:, None, :]) & (jnp.arange(7)[None, :] <= jnp.arange(7)[:, None])
        s = jnp.where(keep[:, None], s, -jnp.inf)
        return jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(s, axis=-1), vv)

    def ours(q, k, v, sq, sk):
        return tj.attention(q, k, v, segment_ids_q=sq, segment_ids_k=sk, causal=True)

    o = jax.jit(ours)(q, k, v, seg, seg)
    np.testing.assert_allclose(np.asarray(o), np.asarray(ref(q, k, v)), rtol=2e-5, atol=2e-5)
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(ours(q, k, v, seg, seg) * g), argnums=(0, 1, 2)))(q, k, v)
    want = jax.grad(lambda q, k, v: jnp.sum(ref(q, k, v) * g), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(grads, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    assert float(jnp.max(jnp.abs(o - tj.attention(q, k, v, causal=True)))) > 1e-3


# Sliding windows with Sq != Sk, each row's visible keys listed by hand from the contract's rule
# (j >= i + off - window_left and j <= i + off + window_right, off = Sk - Sq): the reference and the
# cpu backend share their mask code, so only a mask written out independently can catch a wrong rule.
WINDOWS = [
    # (Sq, Sk, window_left, window_right, visible keys per row)
    (2, 4, 1, 0, [{1, 2}, {2, 3}]),
    (4, 2, -1, 0, [set(), set(), {0}, {0, 1}]),
    (3, 5, 0, 1, [{2, 3}, {3, 4}, {4}]),
    (3, 6, 2, -1, [{1, 2, 3, 4, 5}, {2, 3, 4, 5}, {3, 4, 5}]),
]


def masked(q, k, v, g, visible, scale):
    """o, lse and the gradients of sum(o * g) for one head in float64, over the keys each row sees."""
    q, k, v, g = (t.astype(np.float64) for t in (q, k, v, g))
    Sq, Sk = q.shape[0], k.shape[0]
    mask = np.array([[j in visible[i] for j in range(Sk)] for i in range(Sq)])
    s = np.where(mask, scale * q @ k.T, -np.inf)
    lse = np.full(Sq, -np.inf)
    p = np.zeros((Sq, Sk))
    for i in range(Sq):
        if mask[i].any():
            m = s[i, mask[i]].max()
            lse[i] = m + np.log(np.exp(s[i, mask[i]] - m).sum())
            p[i] = np.where(mask[i], np.exp(s[i] - lse[i]), 0.0)
    o = p @ v
    dp = g @ v.T
    ds = p * (dp - (g * o).sum(1, keepdims=True))
    return o, lse, scale * ds @ k, scale * ds.T @ q, p.T @ g


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("Sq,Sk,left,right,visible", WINDOWS)
def test_windows_with_sq_not_sk_against_a_mask_written_out(impl, Sq, Sk, left, right, visible):
    rng = np.random.default_rng(Sq * 10 + Sk)
    q, k, v = (rng.standard_normal((1, n, 1, 4)).astype(np.float32) for n in (Sq, Sk, Sk))
    g = rng.standard_normal((1, Sq, 1, 4)).astype(np.float32)
    opts = dict(window_left=left, window_right=right, scale=0.5, implementation=impl)
    fwd = tessera.call("attention", "forward", {"q": q, "k": k, "v": v}, **opts)
    o, lse, dq, dk, dv = masked(q[0, :, 0], k[0, :, 0], v[0, :, 0], g[0, :, 0], visible, 0.5)
    np.testing.assert_allclose(fwd["o"][0, :, 0], o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fwd["lse"][0, 0], lse, rtol=1e-5, atol=1e-6)  # -inf where a row sees nothing
    grads = tessera.call("attention", "backward", {"q": q, "k": k, "v": v, "grad_o": g}, **opts)
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        np.testing.assert_allclose(grads[name][0, :, 0], want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("blocks", ["q=64,kv=128", "q=96,kv=256", "q=128,kv=512"])
def test_the_last_key_of_a_tail_tile_is_seen(dtype, blocks):
    """Sk = 257: the last key is alone in its kv tile (kv = 128 or 256) or ends a clipped one.
    It gets a score far above the others, so o ≈ its value: a backend that dropped it would be off
    by ~1, where the grid's 16-bit tolerances (2^-8 relative) cannot see one ordinary key."""
    if dtype == "bf16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dt = ml_dtypes.bfloat16
    else:
        dt = {"f32": np.float32, "f16": np.float16}[dtype]
    rng = np.random.default_rng(7)
    Sq, Sk, D = 3, 257, 16
    q = rng.uniform(0.4, 0.5, (1, Sq, 1, D)).astype(np.float32)
    k = rng.uniform(-0.5, 0.5, (1, Sk, 1, D)).astype(np.float32)
    v = rng.uniform(-0.5, 0.5, (1, Sk, 1, D)).astype(np.float32)
    k[0, -1, 0] = 8.0  # its score 0.25·q·k >= 12.8 against |s| <= 1 for the others: weight > 0.99
    v[0, -1, 0] = 1.0
    q, k, v = (a.astype(dt) for a in (q, k, v))
    o = tessera.attention(q, k, v, implementation="cpu", block_sizes=blocks).astype(np.float32)
    want, _ = expected(*(a.astype(np.float32) for a in (q, k, v)))
    np.testing.assert_allclose(o, want, rtol=0, atol=2**-6)
    assert np.all(o[0, :, 0] > 0.9)  # the last key's value dominates


def test_numpy_strided_views_are_copied_once():
    """q, k and v split off one fused array (strided views) give the values of their copies."""
    q, k, v = qkv(Sk=7, Dv=8)
    fused = np.concatenate([q, k, v], axis=2)              # [B, S, Hq + 2·Hkv, D]
    views = fused[:, :, :4], fused[:, :, 4:6], fused[:, :, 6:]
    assert not any(t.flags.c_contiguous for t in views)
    got = tessera.attention(*views, causal=True)
    np.testing.assert_array_equal(got, tessera.attention(q, k, v, causal=True))


# ---- dropout: the mask is Philox4x32-10 of (j // 4, i, h, n) under the seed (docs/kernels/attention.md) ----

def philox_keep(seed, B, Hq, Sq, Sk, p):
    """The documented keep rule written out in NumPy: [B, Hq, Sq, Sk] booleans."""
    M = np.uint64(0xFFFFFFFF)
    n, h, i, j = (a.astype(np.uint64) for a in np.meshgrid(np.arange(B), np.arange(Hq), np.arange(Sq), np.arange(Sk),
                                                           indexing="ij"))
    c = [j >> np.uint64(2), i, h, n]
    k0, k1 = (np.uint64(int(s) & 0xFFFFFFFF) for s in seed)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & M, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & M]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M, (k1 + np.uint64(0xBB67AE85)) & M
    word = np.choose((j & np.uint64(3)).astype(np.int64), c)
    return word >= np.uint64(min(int(np.floor(p * 2.0 ** 32)), 2 ** 32 - 1))


def mask_through_o(seed, B, Sq, Sk, Hq, p, impl=None):
    """z_ij (0 or 1/(1 − p)) as tessera applies it, read back through o: q = 0 makes every score 0
    and v the identity makes o_ij = z_ij / Sk. [B, Hq, Sq, Sk]."""
    q = np.zeros((B, Sq, Hq, 8), np.float32)
    k = np.ones((B, Sk, 1, 8), np.float32)
    v = np.ascontiguousarray(np.broadcast_to(np.eye(Sk, dtype=np.float32)[None, :, None, :], (B, Sk, 1, Sk)))
    o = tessera.attention(q, k, v, dropout_p=p, dropout_seed=np.asarray(seed, np.int32), implementation=impl)
    return np.transpose(o, (0, 2, 1, 3)) * Sk


def expected_dropout(q, k, v, z, causal=False):
    """o and lse in float64 with the mask z [B, Hq, Sq, Sk] on the probabilities (lse undropped)."""
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, g = k.shape[1], Hq // k.shape[2]
    s = np.einsum("bihd,bjhd->bhij", q, np.repeat(k, g, axis=2)) / np.sqrt(D)
    if causal:
        s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq), s, -np.inf)
    lse = np.log(np.exp(s).sum(-1))
    return np.einsum("bhij,bjhd->bihd", np.exp(s - lse[..., None]) * z, np.repeat(v, g, axis=2)), lse


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_dropout_mask_is_the_documented_philox_rule(impl):
    for seed, p in (((7, -3), 0.1), ((-2 ** 31, 2 ** 31 - 1), 0.5)):
        z = mask_through_o(seed, 2, 5, 37, 3, p, impl)
        keep = philox_keep(seed, 2, 3, 5, 37, p)
        np.testing.assert_array_equal(z > 0, keep)
        np.testing.assert_allclose(z[keep], 1 / (1 - p), rtol=1e-6)
        assert 0 < keep.mean() < 1


@pytest.mark.parametrize("causal", [False, True])
def test_numpy_dropout_against_the_mask_written_out(causal):
    q, k, v = qkv(seed=11)
    seed, p = np.array([123, 456], np.int32), 0.3
    z = np.where(philox_keep(seed, 2, 4, 7, 9, p), 1 / (1 - p), 0.0)
    out = tessera.call("attention", "forward", {"q": q, "k": k, "v": v, "dropout_seed": seed}, causal=causal,
                       dropout_p=p)
    want, lse = expected_dropout(q, k, v, z, causal)
    np.testing.assert_allclose(out["o"], want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(out["lse"], lse, rtol=2e-5, atol=2e-5)
    assert np.abs(out["o"] - expected(q, k, v, causal=causal)[0]).max() > 1e-2  # the mask did something


def test_numpy_dropout_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"dropout_p > 0 needs dropout_seed"):
        tessera.attention(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\)"):
        tessera.attention(q, k, v, dropout_p=1.0, dropout_seed=np.zeros(2, np.int32))
    with pytest.raises((ValueError, TypeError), match="dropout_seed"):
        tessera.attention(q, k, v, dropout_p=0.1, dropout_seed=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"dropout_seed must be \[2\]"):
        tessera.attention(q, k, v, dropout_p=0.1, dropout_seed=np.zeros(3, np.int32))


def test_torch_dropout_gradients_match_autodiff_with_the_same_mask():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    seed, p = np.array([99, -5], np.int32), 0.25
    z = torch.from_numpy(np.where(philox_keep(seed, 2, 4, 7, 9, p), 1 / (1 - p), 0.0).astype(np.float32))
    q, k, v = (torch.from_numpy(t).requires_grad_() for t in qkv(seed=12))
    o = tt.attention(q, k, v, causal=True, dropout_p=p, dropout_seed=torch.from_numpy(seed))
    g = torch.linspace(-1, 1, o.numel()).reshape(o.shape)
    got = torch.autograd.grad((o * g).sum(), (q, k, v))

    kk, vv = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, kk) / 8 ** 0.5
    s = s.masked_fill(torch.arange(9)[None, :] > torch.arange(7)[:, None] + 2, float("-inf"))
    ref = torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1) * z, vv)
    want = torch.autograd.grad((ref * g).sum(), (q, k, v))
    torch.testing.assert_close(o, ref, rtol=2e-5, atol=2e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


def test_torch_dropout_seed_comes_from_torch_generator():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    q, k, v = (torch.from_numpy(t) for t in qkv(seed=13))
    torch.manual_seed(5)
    a = tt.attention(q, k, v, dropout_p=0.2)
    torch.manual_seed(5)
    drawn = torch.randint(-2 ** 31, 2 ** 31 - 1, (2,), dtype=torch.int32)  # the draw the call makes
    torch.manual_seed(5)
    b = tt.attention(q, k, v, dropout_p=0.2)
    c = tt.attention(q, k, v, dropout_p=0.2)  # the generator moved on: another mask
    assert torch.equal(a, b) and not torch.equal(a, c)
    np.testing.assert_array_equal(a.numpy(), tessera.attention(q.numpy(), k.numpy(), v.numpy(), dropout_p=0.2,
                                                               dropout_seed=drawn.numpy()))
    # p = 0 draws nothing and is the plain attention, bit for bit.
    state = torch.get_rng_state()
    assert torch.equal(tt.attention(q, k, v, dropout_p=0.0), tt.attention(q, k, v))
    assert torch.equal(state, torch.get_rng_state())


def test_torch_compile_with_dropout_is_eager():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    q, k, v = (torch.from_numpy(t).requires_grad_() for t in qkv(seed=14))
    seed = torch.tensor([3, 4], dtype=torch.int32)

    def step(q, k, v, seed):
        return tt.attention(q, k, v, causal=True, dropout_p=0.3, dropout_seed=seed).square().sum()

    eager = torch.autograd.grad(step(q, k, v, seed), (q, k, v))
    compiled = torch.compile(step, fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v, seed), (q, k, v))
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_jax_dropout_seed_is_traced_under_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v = qkv(seed=15)
    g = np.random.default_rng(16).standard_normal((2, 7, 4, 6)).astype(np.float32)

    @jax.jit
    def loss_and_grads(q, k, v, seed):
        f = lambda q, k, v: jnp.sum(tj.attention(q, k, v, causal=True, dropout_p=0.4, dropout_seed=seed) * g)
        return jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, v)

    seeds = [np.array([1, 2], np.int32), np.array([1, 3], np.int32)]
    results = [loss_and_grads(q, k, v, s) for s in seeds]
    assert loss_and_grads._cache_size() == 1  # a new seed is a new value, not a new compilation
    for s, (loss, grads) in zip(seeds, results):
        want = tessera.call("attention", "fused", {"q": q, "k": k, "v": v, "dropout_seed": s, "grad_o": g},
                            causal=True, dropout_p=0.4)
        np.testing.assert_allclose(float(loss), float((want["o"] * g).sum()), rtol=1e-5)
        for a, n in zip(grads, ("dq", "dk", "dv")):
            np.testing.assert_allclose(np.asarray(a), want[n], rtol=1e-5, atol=1e-6)
    assert float(results[0][0]) != float(results[1][0])


def test_dropout_seed_takes_uint32_words_and_jax_keys():
    jax = pytest.importorskip("jax")
    import tessera.jax as tj

    q, k, v = qkv(seed=17)
    words = np.array([0xDEADBEEF, 7], np.uint32)  # a Philox key as unsigned words: the same bits
    want = tessera.attention(q, k, v, dropout_p=0.3, dropout_seed=words.view(np.int32))
    np.testing.assert_array_equal(tessera.attention(q, k, v, dropout_p=0.3, dropout_seed=words), want)
    raw, typed = jax.random.PRNGKey(11), jax.random.key(11)  # raw uint32 [2] and typed threefry keys
    by_raw = np.asarray(tj.attention(q, k, v, dropout_p=0.3, dropout_seed=raw))
    np.testing.assert_array_equal(by_raw, np.asarray(tj.attention(q, k, v, dropout_p=0.3, dropout_seed=typed)))
    np.testing.assert_array_equal(by_raw, tessera.attention(q, k, v, dropout_p=0.3, dropout_seed=np.asarray(raw)))
    step = jax.jit(lambda q, key, i: tj.attention(q, k, v, dropout_p=0.3, dropout_seed=jax.random.fold_in(key, i)))
    assert not np.array_equal(np.asarray(step(q, typed, 1)), np.asarray(step(q, typed, 2)))


# The additive bias: [B|1, Hq|1, Sq|1, Sk|1], added after the soft cap, −inf masking. Against the
# softmax written out in float64 (values, and dbias along a random direction by central
# differences), PyTorch's SDPA with a float attn_mask (its autodiff gives the mask's gradient) and
# JAX's own autodiff.
def expected_biased(q, k, v, bias, causal=False, softcap=0.0):
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, g = k.shape[1], Hq // k.shape[2]
    s = np.einsum("bihd,bjhd->bhij", q, np.repeat(k, g, axis=2)) / np.sqrt(D)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    s = s + bias.astype(np.float64)
    if causal:
        s = np.where(np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq), s, -np.inf)
    m = np.max(s, -1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    with np.errstate(divide="ignore"):
        lse = m[..., 0] + np.log(p.sum(-1))  # −inf where every key is masked
    with np.errstate(invalid="ignore"):
        o = np.einsum("bhij,bjhd->bihd", np.nan_to_num(p / p.sum(-1, keepdims=True)), np.repeat(v, g, axis=2))
    return o, lse


BIAS_SHAPES = {"BHQK": (2, 4, 7, 9), "1HQK": (1, 4, 7, 9), "B11K": (2, 1, 1, 9), "11Q1": (1, 1, 7, 1)}


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("shape", list(BIAS_SHAPES))
def test_numpy_bias_against_the_softmax_written_out(impl, shape):
    q, k, v = qkv(seed=11)
    rng = np.random.default_rng(12)
    bias = rng.standard_normal(BIAS_SHAPES[shape]).astype(np.float32)
    bias[rng.random(bias.shape) < 0.2] = -np.inf  # masked entries (a whole row for "11Q1")
    o, lse = expected_biased(q, k, v, bias, causal=True, softcap=2.0)
    out = tessera.call("attention", "forward", {"q": q, "k": k, "v": v, "bias": bias}, causal=True, softcap=2.0,
                       implementation=impl)
    np.testing.assert_allclose(out["o"], o, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.isneginf(out["lse"]), np.isneginf(lse))
    np.testing.assert_allclose(np.where(np.isneginf(lse), 0, out["lse"]), np.where(np.isneginf(lse), 0, lse),
                               rtol=2e-5, atol=2e-5)
    g = rng.standard_normal(o.shape).astype(np.float32)
    grads = tessera.call("attention", "backward", {"q": q, "k": k, "v": v, "bias": bias, "grad_o": g}, causal=True,
                         softcap=2.0, implementation=impl)
    assert grads["dbias"].shape == bias.shape and grads["dbias"].dtype == np.float32
    assert np.all(grads["dbias"][np.isneginf(bias)] == 0)
    d = np.where(np.isneginf(bias), 0, rng.standard_normal(bias.shape))
    h = 1e-3

    def loss(b):
        return (expected_biased(q, k, v, b, causal=True, softcap=2.0)[0] * g).sum()

    fd = (loss(bias + h * d) - loss(bias - h * d)) / (2 * h)
    np.testing.assert_allclose((grads["dbias"] * d).sum(), fd, rtol=1e-4, atol=1e-4)


def test_numpy_bias_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"bias must be \[B\|1, Hq\|1, Sq\|1, Sk\|1\]"):
        tessera.attention(q, k, v, bias=np.zeros((2, 4, 7, 8), np.float32))
    with pytest.raises(TypeError, match="bias must be f32 or q's dtype"):  # a dtype error: TypeError
        tessera.attention(q, k, v, bias=np.zeros((1, 1, 1, 9), np.int32))


def test_torch_bias_gradient_matches_sdpa_and_is_skipped_when_frozen():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    q, k, v = (torch.from_numpy(t).requires_grad_() for t in qkv(Hq=4, Hkv=4, Dv=8, seed=13))
    bias = torch.randn(1, 4, 7, 9, generator=torch.Generator().manual_seed(14), requires_grad=True)
    o = tessera.attention(q, k, v, bias=bias)
    g = torch.linspace(-1, 1, o.numel()).reshape(o.shape)
    got = torch.autograd.grad((o * g).sum(), (q, k, v, bias))
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias)
    ref = ref.transpose(1, 2)
    want = torch.autograd.grad((ref * g).sum(), (q, k, v, bias))
    torch.testing.assert_close(o, ref, rtol=2e-5, atol=2e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)
    assert got[3].shape == bias.shape
    # A bias that does not require grad: dbias is skipped (no pass for it), the others unchanged.
    frozen = bias.detach()
    o2 = tessera.attention(q, k, v, bias=frozen)
    again = torch.autograd.grad((o2 * g).sum(), (q, k, v))
    for a, b in zip(again, got[:3]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    step = torch.compile(lambda q, k, v, b: tessera.attention(q, k, v, bias=b), fullgraph=True)
    torch.testing.assert_close(step(q, k, v, bias), o, rtol=0, atol=0)


def test_jax_bias_gradient_under_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v = (jnp.asarray(t) for t in qkv(seed=15))
    bias = jnp.asarray(np.random.default_rng(16).standard_normal((2, 1, 1, 9)).astype(np.float32))
    g = jnp.asarray(np.random.default_rng(17).standard_normal((2, 7, 4, 6)).astype(np.float32))

    def ref(q, k, v, b):
        kk, vv = jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)
        s = jnp.einsum("bihd,bjhd->bhij", q, kk) / jnp.sqrt(8.0) + b
        return jnp.einsum("bhij,bjhd->bihd", jax.nn.softmax(s, axis=-1), vv)

    ours = jax.jit(jax.grad(lambda q, k, v, b: jnp.sum(tj.attention(q, k, v, bias=b) * g), argnums=(0, 1, 2, 3)))
    theirs = jax.grad(lambda q, k, v, b: jnp.sum(ref(q, k, v, b) * g), argnums=(0, 1, 2, 3))
    np.testing.assert_allclose(np.asarray(tj.attention(q, k, v, bias=bias)), np.asarray(ref(q, k, v, bias)),
                               rtol=2e-5, atol=2e-5)
    for a, b in zip(ours(q, k, v, bias), theirs(q, k, v, bias)):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    # frozen="bias": the backward skips dbias; the other gradients are the same bits.
    frozen = jax.jit(jax.grad(lambda q, k, v: jnp.sum(tj.attention(q, k, v, bias=bias, frozen="bias") * g),
                              argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(frozen, ours(q, k, v, bias)[:3]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# tessera.torch.scaled_dot_product_attention: SDPA's call ([B, H, L, E], bool or float attn_mask,
# top-left is_causal, enable_gqa) against torch.nn.functional.scaled_dot_product_attention itself,
# values and every gradient (the float mask's included).
def sdpa_inputs(torch, B=2, Hq=4, Hkv=2, L=7, S=9, E=8, Ev=6, seed=20):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, Hq, L, E, generator=g).requires_grad_(), torch.randn(B, Hkv, S, E, generator=g).requires_grad_(),
            torch.randn(B, Hkv, S, Ev, generator=g).requires_grad_())


@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "causal_square", "causal_l_lt_s", "causal_l_gt_s",
                                  "three_dims"])
def test_torch_sdpa_call_matches_sdpa(case):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    import tessera.torch as tt

    L, S = {"causal_square": (9, 9), "causal_l_gt_s": (11, 6)}.get(case, (7, 9))
    q, k, v = sdpa_inputs(torch, L=L, S=S)
    kw = dict(enable_gqa=True, scale=0.3)
    leaves = [q, k, v]
    if case == "bool_mask":  # [L, S], each row keeps key 0
        m = torch.rand(L, S, generator=torch.Generator().manual_seed(21)) > 0.4
        m[:, 0] = True
        kw["attn_mask"] = m
    if case == "float_mask":
        kw["attn_mask"] = torch.randn(2, 1, L, S, generator=torch.Generator().manual_seed(22)).requires_grad_()
        leaves.append(kw["attn_mask"])
    if case.startswith("causal"):
        kw["is_causal"] = True
    if case == "three_dims":
        q, k, v = (t.detach()[0].requires_grad_() for t in (q, k, v))
        leaves = [q, k, v]
    o = tt.scaled_dot_product_attention(q, k, v, **kw)
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(o, ref, rtol=2e-5, atol=2e-5)
    g = torch.linspace(-1, 1, o.numel()).reshape(o.shape)
    for a, b in zip(torch.autograd.grad((o * g).sum(), leaves), torch.autograd.grad((ref * g).sum(), leaves)):
        torch.testing.assert_close(a, b, rtol=2e-4, atol=2e-5)


def test_torch_sdpa_call_errors_and_compile():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    q, k, v = sdpa_inputs(torch)
    with pytest.raises(ValueError, match="need enable_gqa=True"):
        tt.scaled_dot_product_attention(q, k, v)
    import torch.nn.functional as F
    k1, v1 = k[:, :1].detach(), v[:, :1].detach()  # one kv head broadcasts without enable_gqa, as SDPA's
    torch.testing.assert_close(tt.scaled_dot_product_attention(q, k1, v1),
                               F.scaled_dot_product_attention(q, k1, v1), rtol=2e-5, atol=2e-5)
    for scale in (0.0, -0.3):  # the kernel takes scale > 0; SDPA takes any
        torch.testing.assert_close(tt.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True),
                                   F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True),
                                   rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="attn_mask and is_causal=True together"):
        tt.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(7, 9, dtype=torch.bool), is_causal=True,
                                        enable_gqa=True)
    with pytest.raises(ValueError, match=r"must all be \[B, H, L, E\]"):
        tt.scaled_dot_product_attention(q[0, 0], k[0, 0], v[0, 0])
    # A row whose keys are all masked: 0, where SDPA's math backend gives NaN.
    m = torch.ones(7, 9, dtype=torch.bool)
    m[3] = False
    o = tt.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    assert torch.all(o[:, :, 3] == 0) and torch.isfinite(o).all()
    step = torch.compile(lambda q, k, v, m: tt.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True),
                         fullgraph=True)
    torch.testing.assert_close(step(q, k, v, m), o, rtol=0, atol=0)


# tessera.jax.dot_product_attention: jax.nn.dot_product_attention's call (bias, bool mask, top-left
# is_causal and local windows with T != S, key lengths) against JAX's own, values and gradients of
# q, k, v and the bias under jit.
DPA_CASES = [dict(), dict(bias=True), dict(mask=True), dict(is_causal=True), dict(bias=True, mask=True, is_causal=True),
             dict(local_window_size=(2, 1)), dict(key_value_seq_lengths=True), dict(square=True, is_causal=True),
             dict(square=True, local_window_size=(3, 0), bias=True), dict(square=True, local_window_size=2),
             dict(square=True, local_window_size=(-1, 2), empty_last_row=True), dict(bias="bf16"), dict(scale=0.0, mask=True),
             dict(scale=-0.4, is_causal=True)]


@pytest.mark.parametrize("case", range(len(DPA_CASES)))
def test_jax_dot_product_attention_matches_jax(case):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    spec = dict(DPA_CASES[case])
    rng = np.random.default_rng(30 + case)
    S = 7 if spec.pop("square", False) else 9
    empty_last_row = spec.pop("empty_last_row", False)  # ours 0 there, JAX's the mean of v: compared apart
    q = jnp.asarray(rng.standard_normal((2, 7, 4, 8)).astype(np.float32))
    k, v = (jnp.asarray(rng.standard_normal((2, S, 2, 8)).astype(np.float32)) for _ in range(2))
    want_bias = spec.pop("bias", False)
    bias = jnp.asarray(rng.standard_normal((1, 4, 7, S)).astype(np.float32)) if want_bias else None
    if want_bias == "bf16":  # neither f32 nor q's dtype: JAX takes it, so does the drop-in
        bias = bias.astype(jnp.bfloat16)
    kw = dict(spec)
    if kw.get("mask"):
        m = rng.random((2, 1, 7, S)) > 0.3
        m[..., 0] = True
        kw["mask"] = jnp.asarray(m)
    if kw.get("key_value_seq_lengths"):
        kw["key_value_seq_lengths"] = jnp.asarray([5, S], jnp.int32)
    g = jnp.asarray(rng.standard_normal((2, 7, 4, 8)).astype(np.float32))
    rows = slice(0, 6) if empty_last_row else slice(None)
    if empty_last_row:
        g = g.at[:, 6].set(0.0)
        assert float(jnp.max(jnp.abs(tj.dot_product_attention(q, k, v, **kw)[:, 6]))) == 0.0

    def loss(fn):
        return lambda q, k, v, b: jnp.sum(fn(q, k, v, bias=b, **kw) * g)

    np.testing.assert_allclose(np.asarray(tj.dot_product_attention(q, k, v, bias=bias, **kw)[:, rows]),
                               np.asarray(jax.nn.dot_product_attention(q, k, v, bias=bias, **kw)[:, rows]),
                               rtol=2e-5, atol=2e-5)
    argnums = (0, 1, 2, 3) if bias is not None and bias.dtype == jnp.float32 else (0, 1, 2)
    ours = jax.jit(jax.grad(loss(tj.dot_product_attention), argnums=argnums))(q, k, v, bias)
    theirs = jax.grad(loss(jax.nn.dot_product_attention), argnums=argnums)(q, k, v, bias)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


def test_jax_dot_product_attention_refuses_what_it_does_not_take():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v = (jnp.asarray(t) for t in qkv())
    with pytest.raises(NotImplementedError, match="query_seq_lengths"):
        tj.dot_product_attention(q, k, v, query_seq_lengths=jnp.asarray([3, 7]))
    with pytest.raises(ValueError, match="implementation='xla' is JAX's"):
        tj.dot_product_attention(q, k, v, implementation="xla")
    # [T, N, H] without the batch dim, as jax.nn's
    o = tj.dot_product_attention(q[0], k[0], v[0], is_causal=True)
    np.testing.assert_allclose(np.asarray(o), np.asarray(tj.dot_product_attention(q, k, v, is_causal=True)[0]),
                               rtol=0, atol=0)


def test_upstream_gradient_keeps_its_outputs_dtype(monkeypatch):
    """A bf16 o's gradient reaches the kernel in bf16 (the kernels take f32 or the inputs' dtype;
    on the cpu backend a bf16 dO keeps the backward on its bf16 dot route, about twice as fast as
    the f32 route an f32 copy forced). JAX: the traced FFI call's grad_o dtype; PyTorch: the
    gradients equal those from an upstream gradient given in bf16 to the C++ backward directly."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v = (jnp.asarray(t, jnp.bfloat16) for t in qkv(seed=40))
    seen = []
    real = tj._ffi

    def spy(kern, pass_, tensors, options, ex, skip=()):
        if pass_ == "backward":
            seen.append(tensors["grad_o"].dtype)
        return real(kern, pass_, tensors, options, ex, skip)

    monkeypatch.setattr(tj, "_ffi", spy)
    jax.grad(lambda q: jnp.sum(tj.attention(q, k, v).astype(jnp.float32)))(q)
    assert seen == [jnp.dtype(jnp.bfloat16)]

    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    tq, tk, tv = (torch.from_numpy(t).to(torch.bfloat16) for t in qkv(seed=41))
    g = torch.from_numpy(np.random.default_rng(42).standard_normal((2, 7, 4, 6)).astype(np.float32)).to(torch.bfloat16)
    leaves = [t.clone().requires_grad_() for t in (tq, tk, tv)]
    got = torch.autograd.grad((tt.attention(*leaves) * g).sum(), leaves)
    want = tessera.call("attention", "backward", {"q": tq, "k": tk, "v": tv, "grad_o": g})
    for a, n in zip(got, ("dq", "dk", "dv")):
        assert torch.equal(a, torch.from_numpy(want[n].astype(np.float32)).to(torch.bfloat16)), n
