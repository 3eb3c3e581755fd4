"""tessera.paged_attention from NumPy, PyTorch and JAX (jit): o and lse against the contract written
in NumPy (keys gathered from the pages, softmax in float64), with NaN in every unused cache slot,
shuffled and shared pages, a q_len-0 sequence, GQA, Dv != D, window, softcap and sinks; errors."""
import numpy as np
import pytest

import tessera


def problem(seed=0, q_lens=(1, 4, 0, 3), kv_lens=(9, 6, 2, 11), Hq=4, Hkv=2, D=8, Dv=6, ps=4):
    rng = np.random.default_rng(seed)
    pages = [-(-n // ps) for n in kv_lens]
    P = sum(pages) + 2
    perm = rng.permutation(P).astype(np.int32)
    pt = np.full((len(kv_lens), max(pages) + 1), -7, np.int32)  # entries past the used pages: never read
    nxt = 0
    for s, n in enumerate(pages):
        pt[s, :n] = perm[nxt:nxt + n]
        nxt += n
    if pages[3] >= 2 and pages[0] >= 2:  # sequence 3 shares sequence 0's first (full) page
        pt[3, 0] = pt[0, 0]
    k = np.full((P, ps, Hkv, D), np.nan, np.float32)
    v = np.full((P, ps, Hkv, Dv), np.nan, np.float32)
    for s, n in enumerate(kv_lens):
        for j in range(n):
            page, slot = pt[s, j // ps], j % ps
            if np.isnan(k[page, slot]).any():
                k[page, slot] = rng.uniform(-1, 1, (Hkv, D))
                v[page, slot] = rng.uniform(-1, 1, (Hkv, Dv))
    q = rng.uniform(-2, 2, (sum(q_lens), Hq, D)).astype(np.float32)
    cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return q, k, v, pt, np.array(kv_lens, np.int32), cu


def expected(q, k, v, pt, kv, cu, causal=False, window=-1, softcap=0.0, scale=None, sinks=None):
    T, Hq, D = q.shape
    Hkv, Dv, ps = k.shape[2], v.shape[3], k.shape[1]
    scale = 1 / np.sqrt(D) if scale is None else scale
    o, lse = np.zeros((T, Hq, Dv)), np.full((T, Hq), -np.inf)
    for s in range(len(kv)):
        ql = cu[s + 1] - cu[s]
        for i in range(ql):
            t, pos = cu[s] + i, kv[s] - ql + i
            js = [j for j in range(kv[s]) if (not causal or j <= pos) and (window < 0 or j >= pos - window)]
            rows = [(pt[s, j // ps], j % ps) for j in js]
            for h in range(Hq):
                g = h // (Hq // Hkv)
                x = np.array([scale * np.dot(q[t, h].astype(np.float64), k[p, sl, g]) for p, sl in rows])
                if softcap > 0:
                    x = softcap * np.tanh(x / softcap)
                logits = np.concatenate([x, [sinks[h]]]) if sinks is not None else x
                m = logits.max()
                lse[t, h] = m + np.log(np.exp(logits - m).sum())
                w = np.exp(x - lse[t, h])
                o[t, h] = sum(wj * v[p, sl, g] for wj, (p, sl) in zip(w, rows))
    return o, lse


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("opts", [dict(causal=True), dict(causal=True, window=3, softcap=2.5, scale=0.3), dict()])
def test_numpy_matches_the_contract(impl, opts):
    q, k, v, pt, kv, cu = problem()
    o, lse = tessera.paged_attention(q, k, v, pt, kv, cu, implementation=impl, return_lse=True, **opts)
    want_o, want_lse = expected(q, k, v, pt, kv, cu, **opts)
    assert o.shape == (8, 4, 6) and lse.shape == (8, 4) and lse.dtype == np.float32
    np.testing.assert_allclose(o, want_o, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)


def test_numpy_sinks_and_errors():
    q, k, v, pt, kv, cu = problem(seed=1)
    sinks = np.array([0.5, -np.inf, 1.0, -0.3], np.float32)
    o, lse = tessera.paged_attention(q, k, v, pt, kv, cu, sinks=sinks, causal=True, return_lse=True)
    want_o, want_lse = expected(q, k, v, pt, kv, cu, causal=True, sinks=sinks)
    np.testing.assert_allclose(o, want_o, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)
    bad = pt.copy()
    bad[1, 0] = 999
    with pytest.raises(ValueError, match="sequence 1"):
        tessera.paged_attention(q, k, v, bad, kv, cu)
    short = kv.copy()
    short[3] = 2  # q_len 3
    with pytest.raises(ValueError, match=r"sequence 3: q_len=3 is above kv_lens\[3\] = 2"):
        tessera.paged_attention(q, k, v, pt, short, cu)


def test_torch():
    torch = pytest.importorskip("torch")
    import tessera.torch  # noqa: F401
    q, k, v, pt, kv, cu = problem(seed=2)
    args = [torch.from_numpy(a) for a in (q, k, v, pt, kv, cu)]
    o = tessera.torch.paged_attention(*args, causal=True)
    want_o, _ = expected(q, k, v, pt, kv, cu, causal=True)
    torch.testing.assert_close(o, torch.from_numpy(want_o).float(), rtol=2e-5, atol=2e-5)
    half = [a.to(torch.bfloat16) for a in args[:3]]
    ob = tessera.torch.paged_attention(*half, *args[3:], causal=True)
    assert ob.dtype == torch.bfloat16
    # Against the math on the same bf16-rounded inputs; o itself is stored in bf16 (2^-8 relative).
    want_b, _ = expected(*[a.float().numpy() for a in half], pt, kv, cu, causal=True)
    torch.testing.assert_close(ob.float(), torch.from_numpy(want_b).float(), rtol=1e-2, atol=1e-2)


def test_jax_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    q, k, v, pt, kv, cu = problem(seed=3)
    f = jax.jit(lambda q, k, v, pt, kv, cu: tj.paged_attention(q, k, v, pt, kv, cu, causal=True, window=4))
    o = f(*[jnp.asarray(a) for a in (q, k, v, pt, kv, cu)])
    want_o, _ = expected(q, k, v, pt, kv, cu, causal=True, window=4)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=2e-5, atol=2e-5)


def test_forward_only_kernels_refuse_a_gradient():
    """No backward pass: a gradient through o raises in torch and JAX (torch's once came from the
    C++ backward's "forward only"; JAX's now says so before any call)."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    import tessera.torch as tt
    q, k, v, pt, kv, cu = problem(seed=5)
    with pytest.raises(TypeError, match="paged_attention: forward only"):
        jax.grad(lambda q: tj.paged_attention(q, k, v, pt, kv, cu).sum())(jnp.asarray(q))
    qt = torch.from_numpy(q).requires_grad_()
    o = tt.paged_attention(qt, *[torch.from_numpy(a) for a in (k, v, pt, kv, cu)])
    with pytest.raises(RuntimeError, match="paged_attention: forward only"):
        o.sum().backward()


def f8_problem(seed, k_scale=0.02, v_scale=0.05, **kw):
    """problem() with its caches quantized to float8_e4m3fn (raw values up to 1/scale; NaN stays
    NaN), and the caches the contract then reads: raw · scale in float64."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v, pt, kv, cu = problem(seed=seed, **kw)
    k8 = (k / k_scale).astype(ml_dtypes.float8_e4m3fn)
    v8 = (v / v_scale).astype(ml_dtypes.float8_e4m3fn)
    return q, k8, v8, pt, kv, cu, k8.astype(np.float64) * k_scale, v8.astype(np.float64) * v_scale


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("q_dtype", ["float32", "bfloat16"])
def test_numpy_f8_cache_matches_the_contract(impl, q_dtype):
    """An FP8 KV cache (ml_dtypes.float8_e4m3fn) dequantized by k_scale and v_scale: the contract on
    raw · scale. Without the scales the result is far off (they reach the kernel)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k8, v8, pt, kv, cu, k, v = f8_problem(seed=6, D=16, Dv=16)
    q = q.astype(getattr(ml_dtypes, q_dtype) if q_dtype == "bfloat16" else np.float32)
    sinks = np.array([0.5, -np.inf, 1.0, -0.3], np.float32)
    opts = dict(causal=True, window=5, softcap=3.0, sinks=sinks)
    o, lse = tessera.paged_attention(q, k8, v8, pt, kv, cu, k_scale=0.02, v_scale=0.05, implementation=impl,
                                     return_lse=True, **opts)
    want_o, want_lse = expected(q.astype(np.float32), k, v, pt, kv, cu, **opts)
    tol = 2e-5 if q_dtype == "float32" else 1e-2  # o in q's dtype
    np.testing.assert_allclose(o.astype(np.float32), want_o, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)
    o1 = tessera.paged_attention(q, k8, v8, pt, kv, cu, implementation=impl, **opts)
    assert np.abs(o1.astype(np.float32) - want_o).max() > 1.0


def test_numpy_f8_cache_errors():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k8, v8, pt, kv, cu, _, v = f8_problem(seed=7)
    with pytest.raises(TypeError, match="v_cache must be f8e4m3 like k_cache, got f32"):
        tessera.paged_attention(q, k8, v.astype(np.float32), pt, kv, cu)
    with pytest.raises(TypeError, match=r"k_cache must be f32 \(q's dtype\) or f8e4m3, got bf16"):
        tessera.paged_attention(q, k8.astype(ml_dtypes.bfloat16), v8, pt, kv, cu)
    with pytest.raises(ValueError, match="k_scale must be finite in f32 and > 0, got 0"):
        tessera.paged_attention(q, k8, v8, pt, kv, cu, k_scale=0.0)
    with pytest.raises(ValueError, match="v_scale must be finite in f32 and > 0, got -1"):
        tessera.paged_attention(q, k8, v8, pt, kv, cu, v_scale=-1.0)
    with pytest.raises(TypeError, match="q must be f32, bf16 or f16, got f8e4m3"):
        tessera.paged_attention(q.astype(ml_dtypes.float8_e4m3fn), k8, v8, pt, kv, cu)


def test_torch_f8_cache():
    """torch.float8_e4m3fn caches (DLPack's float8 code, no copy) with a bf16 q, eager and compiled."""
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    q, k8, v8, pt, kv, cu, k, v = f8_problem(seed=8)
    kt = torch.from_numpy(k8.view(np.uint8)).view(torch.float8_e4m3fn)
    vt = torch.from_numpy(v8.view(np.uint8)).view(torch.float8_e4m3fn)
    qb = torch.from_numpy(q).to(torch.bfloat16)
    idx = [torch.from_numpy(a) for a in (pt, kv, cu)]
    o = tt.paged_attention(qb, kt, vt, *idx, causal=True, k_scale=0.02, v_scale=0.05)
    assert o.dtype == torch.bfloat16
    want_o, _ = expected(qb.float().numpy(), k, v, pt, kv, cu, causal=True)
    torch.testing.assert_close(o.float(), torch.from_numpy(want_o).float(), rtol=1e-2, atol=1e-2)
    f = torch.compile(lambda *a: tt.paged_attention(*a, causal=True, k_scale=0.02, v_scale=0.05), fullgraph=True)
    torch.testing.assert_close(f(qb, kt, vt, *idx), o, rtol=0, atol=0)


def test_jax_f8_cache_under_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    q, k8, v8, pt, kv, cu, k, v = f8_problem(seed=9)
    f = jax.jit(lambda *a: tj.paged_attention(*a, causal=True, k_scale=0.02, v_scale=0.05, return_lse=True))
    o, lse = f(jnp.asarray(q), jnp.asarray(k8), jnp.asarray(v8), *[jnp.asarray(a) for a in (pt, kv, cu)])
    assert jnp.asarray(k8).dtype == jnp.float8_e4m3fn
    want_o, want_lse = expected(q, k, v, pt, kv, cu, causal=True)
    np.testing.assert_allclose(np.asarray(o), want_o, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(lse), want_lse, rtol=2e-5, atol=2e-5)
