"""tessera.mla_decode from NumPy, PyTorch and JAX (jit): o and lse against the contract's math
written with NumPy in float64 (gather each sequence's keys from its pages, softmax, values = first
dv dims), causal multi-token decode, rows that see nothing, and errors."""
import numpy as np
import pytest

import tessera


def problem(B=3, Sq=2, Hq=4, D=24, page_size=4, lens=(5, 0, 11), seed=0):
    rng = np.random.default_rng(seed)
    max_pages = max(-(-L // page_size) for L in lens) + 1
    P = sum(-(-L // page_size) for L in lens) + 1
    perm = rng.permutation(P)
    pt = np.full((B, max_pages), -1, np.int32)
    n = 0
    for b, L in enumerate(lens):
        for k in range(-(-L // page_size)):
            pt[b, k] = perm[n]
            n += 1
    q = rng.uniform(-1, 1, (B, Sq, Hq, D)).astype(np.float32)
    kv = rng.uniform(-1, 1, (P, page_size, 1, D)).astype(np.float32)
    return q, kv, pt, np.array(lens, np.int32)


def expected(q, kv, pt, lens, dv, causal=False, scale=None):
    B, Sq, Hq, D = q.shape
    ps = kv.shape[1]
    scale = 1 / np.sqrt(D) if scale is None else scale
    o = np.zeros((B, Sq, Hq, dv))
    lse = np.full((B, Sq, Hq), -np.inf)
    for b in range(B):
        L = int(lens[b])
        keys = np.array([kv[pt[b, j // ps], j % ps, 0] for j in range(L)], np.float64).reshape(L, D)
        for i in range(Sq):
            n = max(0, L - Sq + i + 1) if causal else L
            if n == 0:
                continue
            s = scale * q[b, i].astype(np.float64) @ keys[:n].T  # [Hq, n]
            m = s.max(1, keepdims=True)
            lse[b, i] = m[:, 0] + np.log(np.exp(s - m).sum(1))
            o[b, i] = np.exp(s - lse[b, i][:, None]) @ keys[:n, :dv]
    return o, lse


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("causal", [False, True])
def test_numpy_matches_the_math(impl, causal):
    q, kv, pt, lens = problem()
    o, lse = tessera.mla_decode(q, kv, pt, lens, dv=16, causal=causal, scale=0.3, implementation=impl)
    want_o, want_lse = expected(q, kv, pt, lens, 16, causal, 0.3)
    assert o.dtype == np.float32 and lse.dtype == np.float32
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)  # -inf where a row sees nothing
    assert np.all(o[1] == 0) and np.all(np.isneginf(lse[1]))  # L = 0


def test_numpy_default_scale_and_errors():
    q, kv, pt, lens = problem()
    o, lse = tessera.mla_decode(q, kv, pt, lens, dv=24)
    want_o, want_lse = expected(q, kv, pt, lens, 24)
    np.testing.assert_allclose(o, want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dv"):
        tessera.mla_decode(q, kv, pt, lens)  # dv 512 > D 24
    bad = pt.copy()
    bad[2, 1] = 99
    with pytest.raises(ValueError, match=r"page_table\[2, 1\] = 99"):
        tessera.mla_decode(q, kv, bad, lens, dv=8)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\]"):
        tessera.mla_decode(q, kv, pt, np.array([500, 0, 11], np.int32), dv=8)


def test_torch_bf16():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    q, kv, pt, lens = problem(seed=1)
    qb, kvb = torch.from_numpy(q).to(torch.bfloat16), torch.from_numpy(kv).to(torch.bfloat16)
    o, lse = tt.mla_decode(qb, kvb, torch.from_numpy(pt), torch.from_numpy(lens), dv=16, causal=True)
    want_o, want_lse = expected(qb.float().numpy(), kvb.float().numpy(), pt, lens, 16, True)
    # Same rounded inputs, f32 sums; the bf16 path also rounds the softmax weights P to bf16 for
    # P·V (as FlashMLA does): 2^-9 of each weight, so o moves by at most 2^-9 of max |v| = 1 per
    # weight sum: 2^-8 leaves room for the f32 sums (docs/kernels/mla_decode.md).
    np.testing.assert_allclose(o.numpy(), want_o, rtol=0, atol=2**-8)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-4, atol=1e-4)


def test_jax_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    q, kv, pt, lens = problem(seed=2)
    f = jax.jit(lambda q, kv, pt, lens: tj.mla_decode(q, kv, pt, lens, dv=16, causal=True))
    o, lse = f(jnp.asarray(q), jnp.asarray(kv), jnp.asarray(pt), jnp.asarray(lens))
    want_o, want_lse = expected(q, kv, pt, lens, 16, True)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=1e-5, atol=1e-5)


def test_forward_only_kernels_refuse_a_gradient():
    """No backward pass: asking a gradient through o or lse raises (JAX once returned a zero
    gradient for q, torch left q without one), and a call on inputs that need no gradient works."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    import tessera.torch as tt
    q, kv, pt, lens = problem(seed=4)
    with pytest.raises(TypeError, match="mla_decode: forward only"):
        jax.grad(lambda q: tj.mla_decode(q, kv, pt, lens, dv=16)[0].sum())(jnp.asarray(q))
    with pytest.raises(TypeError, match="mla_decode: forward only"):
        jax.grad(lambda q: jnp.where(jnp.isfinite(lse := tj.mla_decode(q, kv, pt, lens, dv=16)[1]), lse, 0).sum())(
            jnp.asarray(q))
    o = jax.grad(lambda q: (tj.mla_decode(jax.lax.stop_gradient(q), kv, pt, lens, dv=16)[0] + q[..., :16]).sum())(
        jnp.asarray(q))
    np.testing.assert_array_equal(np.asarray(o)[..., :16], 1)  # only the other term's gradient
    qt = torch.from_numpy(q).requires_grad_()
    args = [torch.from_numpy(a) for a in (kv, pt, lens)]
    o, lse = tt.mla_decode(qt, *args, dv=16)
    assert o.requires_grad
    with pytest.raises(RuntimeError, match="mla_decode: forward only"):
        (o.sum() + qt.sum()).backward()
    with torch.no_grad():
        o2, _ = tt.mla_decode(qt, *args, dv=16)
    torch.testing.assert_close(o2, o.detach(), rtol=0, atol=0)


def f8_problem(seed=4, kv_scale=0.03):
    """problem() with the latent cache quantized to float8_e4m3fn (raw values up to 1/kv_scale), and
    the cache the contract then reads: raw · kv_scale in float64."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, kv, pt, lens = problem(D=32, seed=seed)
    kv8 = (kv / kv_scale).astype(ml_dtypes.float8_e4m3fn)
    return q, kv8, pt, lens, kv8.astype(np.float64) * kv_scale


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_numpy_f8_cache_matches_the_math(impl):
    """An FP8 latent cache (ml_dtypes.float8_e4m3fn) dequantized by kv_scale (keys and values: they
    are one cache); the result is far off without the scale."""
    q, kv8, pt, lens, kv = f8_problem()
    o, lse = tessera.mla_decode(q, kv8, pt, lens, dv=16, causal=True, kv_scale=0.03, implementation=impl)
    want_o, want_lse = expected(q, kv, pt, lens, 16, causal=True)
    np.testing.assert_allclose(o, want_o, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)
    o1, _ = tessera.mla_decode(q, kv8, pt, lens, dv=16, causal=True, implementation=impl)
    assert np.abs(o1 - want_o).max() > 1.0
    with pytest.raises(ValueError, match="kv_scale must be finite in f32 and > 0, got -1"):
        tessera.mla_decode(q, kv8, pt, lens, dv=16, kv_scale=-1.0)


def test_torch_and_jax_f8_cache():
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    import tessera.torch as tt
    q, kv8, pt, lens, kv = f8_problem(seed=5)
    want_o, want_lse = expected(q, kv, pt, lens, 16)
    kt = torch.from_numpy(kv8.view(np.uint8)).view(torch.float8_e4m3fn)
    o, lse = tt.mla_decode(torch.from_numpy(q).bfloat16(), kt, torch.from_numpy(pt), torch.from_numpy(lens), dv=16,
                           kv_scale=0.03)
    want_b, _ = expected(torch.from_numpy(q).bfloat16().float().numpy(), kv, pt, lens, 16)
    # The bf16 dot route (the chunk's entries widened to bf16, exactly) rounds P to bf16 for P·V:
    # 2^-8 of max |v| = 1 (test_torch_bf16).
    torch.testing.assert_close(o.float(), torch.from_numpy(want_b).float(), rtol=0, atol=2**-8)
    _, want_lse_b = expected(torch.from_numpy(q).bfloat16().float().numpy(), kv, pt, lens, 16)
    np.testing.assert_allclose(lse.numpy(), want_lse_b, rtol=1e-5, atol=1e-5)  # from the f32 weights
    f = jax.jit(lambda *a: tj.mla_decode(*a, dv=16, kv_scale=0.03))
    oj, lj = f(jnp.asarray(q), jnp.asarray(kv8), jnp.asarray(pt), jnp.asarray(lens))
    np.testing.assert_allclose(np.asarray(oj), want_o, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(lj), want_lse, rtol=2e-5, atol=2e-5)
