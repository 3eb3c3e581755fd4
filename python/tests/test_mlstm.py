"""tessera.mlstm from NumPy, PyTorch and JAX: values against the recurrence written in NumPy
(float64), gradients against the same recurrence under torch autograd with the stabilizer m
detached (the contract's m-constant backward), resets, initial and last states, errors."""
import numpy as np
import pytest

import tessera

B, NH, S, DK, DV = 2, 2, 11, 4, 3


def problem(seed=0, state=False):
    rng = np.random.default_rng(seed)
    x = {
        "q": rng.standard_normal((B, NH, S, DK)).astype(np.float32),
        "k": rng.standard_normal((B, NH, S, DK)).astype(np.float32),
        "v": rng.standard_normal((B, NH, S, DV)).astype(np.float32),
        "i": (3 * rng.standard_normal((B, NH, S))).astype(np.float32),
        "f": (2 + 2 * rng.standard_normal((B, NH, S))).astype(np.float32),
        "resets": np.zeros((B, S), np.int32),
    }
    x["resets"][0, [3, 4]] = 1  # two in a row
    x["resets"][1, [0, 7]] = 1  # t = 0 has no effect
    if state:
        x["c0"] = rng.standard_normal((B, NH, DK, DV)).astype(np.float32)
        x["n0"] = rng.standard_normal((B, NH, DK)).astype(np.float32)
        x["m0"] = rng.standard_normal((B, NH)).astype(np.float32)
    return x


def recurrence(xp, x, eps=1e-6, detach=lambda m: m):
    """h and the last states, step by step; `xp` is numpy (float64) or torch (any float dtype)."""
    q, k, v, i, f, r = x["q"], x["k"], x["v"], x["i"], x["f"], x["resets"]
    hs, last = [], []
    for b in range(B):
        hb, lb = [], []
        for h in range(NH):
            if "c0" in x:
                C, n, m = x["c0"][b, h], x["n0"][b, h], x["m0"][b, h]
            else:
                C, n, m = q[b, h, 0, :, None] * v[b, h, 0, None, :] * 0, q[b, h, 0] * 0, i[b, h, 0] * 0
            row = []
            for t in range(S):
                if t > 0 and r[b, t]:
                    C, n, m = C * 0, n * 0, m * 0
                logf = xp.minimum(f[b, h, t], f[b, h, t] * 0) - xp.log1p(xp.exp(-abs(f[b, h, t])))
                m_new = detach(xp.maximum(logf + m, i[b, h, t]))
                F, I = xp.exp(logf + m - m_new), xp.exp(i[b, h, t] - m_new)
                C = F * C + I * k[b, h, t, :, None] * v[b, h, t, None, :]
                n = F * n + I * k[b, h, t]
                m = m_new
                qs = q[b, h, t] / np.sqrt(DK)
                den = xp.maximum(abs((n * qs).sum()), xp.exp(-m)) + eps
                row.append((C * qs[:, None]).sum(0) / den)
            hb.append(xp.stack(row))
            lb.append((C, n, m))
        hs.append(xp.stack(hb))
        last.append(lb)
    return xp.stack(hs), last


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_numpy_forward_resets_initial_and_last_states(impl):
    x = problem(state=True)
    h, c, n, m = tessera.mlstm(**x, return_last_states=True, chunk_size=4, implementation=impl)
    want, last = recurrence(np, {k: a.astype(np.float64) for k, a in x.items()})
    np.testing.assert_allclose(h, want, rtol=1e-4, atol=1e-5)
    for b in range(B):
        for hh in range(NH):
            C, N, M = last[b][hh]
            np.testing.assert_allclose(c[b, hh], C, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(n[b, hh], N, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(m[b, hh], M, rtol=1e-5, atol=1e-5)


def test_numpy_backward_cpu_matches_reference():
    x = problem(seed=1, state=True)
    x["grad_h"] = np.random.default_rng(2).standard_normal((B, NH, S, DV)).astype(np.float32)
    got = tessera.call("mlstm", "backward", x, chunk_size=3, implementation="cpu")
    want = tessera.call("mlstm", "backward", x, implementation="reference")
    assert set(got) == {"dq", "dk", "dv", "di", "df", "dc0", "dn0"}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_numpy_errors():
    x = problem()
    with pytest.raises(ValueError, match="S must be >= 1"):
        tessera.mlstm(**{k: (a[:, :, :0] if a.ndim > 2 else a[:, :0]) for k, a in x.items()})
    with pytest.raises(ValueError, match="c0, n0 and m0 go together"):
        tessera.mlstm(**x, c0=np.zeros((B, NH, DK, DV), np.float32))
    with pytest.raises(ValueError, match="resets must be"):
        tessera.mlstm(**{**x, "resets": np.zeros((B, S + 1), np.int32)})


def test_torch_autograd_matches_detached_m_recurrence():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    x = problem(seed=3, state=True)
    diff = ["q", "k", "v", "i", "f", "c0", "n0"]
    mine = {k: torch.from_numpy(a).requires_grad_(k in diff) for k, a in x.items()}
    ref = {k: torch.from_numpy(a).double().requires_grad_(k in diff) if a.dtype == np.float32 else torch.from_numpy(a)
           for k, a in x.items()}
    dh = torch.linspace(-1, 1, B * NH * S * DV).reshape(B, NH, S, DV)
    h = tt.mlstm(**mine, eps=0.0)
    (h * dh).sum().backward()
    want, _ = recurrence(torch, ref, eps=0.0, detach=lambda m: m.detach())
    (want * dh.double()).sum().backward()
    np.testing.assert_allclose(h.detach().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for k in diff:
        np.testing.assert_allclose(mine[k].grad.numpy(), ref[k].grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=k)


def test_torch_compile():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    x = {k: torch.from_numpy(a) for k, a in problem(seed=4).items()}
    fn = torch.compile(lambda **kw: tt.mlstm(**kw), fullgraph=True)
    np.testing.assert_allclose(fn(**x).numpy(), tt.mlstm(**x).numpy(), rtol=1e-6, atol=1e-6)


def test_jax_jit_and_grad():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    x = problem(seed=5)
    dh = np.random.default_rng(6).standard_normal((B, NH, S, DV)).astype(np.float32)
    resets = jnp.asarray(x["resets"])

    def loss(q, k, v, i, f):
        return jnp.sum(tj.mlstm(q, k, v, i, f, resets=resets) * dh)

    args = [x[n] for n in ("q", "k", "v", "i", "f")]
    h = jax.jit(lambda *a: tj.mlstm(*a, resets=resets))(*args)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)
    np.testing.assert_allclose(np.asarray(h), tessera.mlstm(**x), rtol=1e-5, atol=1e-6)
    want = tessera.call("mlstm", "backward", {**x, "grad_h": dh})
    for name, g in zip(("dq", "dk", "dv", "di", "df"), grads):
        np.testing.assert_allclose(np.asarray(g), want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def _split_calls(fn, x, cut, **kw):
    """h of one call over S, and of two chained calls (the first's last state as the second's
    initial state) over [0, cut) and [cut, S)."""
    part = lambda a: a.contiguous() if hasattr(a, "contiguous") else a  # noqa: E731 - torch slices
    first = {n: (part(a[:, :, :cut]) if n in "qkvif" else a) for n, a in x.items()}
    second = {n: (part(a[:, :, cut:]) if n in "qkvif" else a) for n, a in x.items()}
    h1, c, n, m = fn(**first, return_last_states=True, **kw)
    h2 = fn(**second, c0=c, n0=n, m0=m, **kw)
    return fn(**x, **kw), h1, h2


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_torch_gradients_flow_through_the_last_states(impl):
    """Two chained calls give one call's gradients: the second call's dc0, dn0 reach the first
    call's c_last, n_last (no resets: the chain is then exactly one sequence)."""
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    x = {n: a for n, a in problem(3).items() if n != "resets"}
    w = torch.from_numpy(np.random.default_rng(4).standard_normal((B, NH, S, DV)).astype(np.float32))
    grads = []
    for chained in (False, True):
        t = {n: torch.from_numpy(a).requires_grad_() for n, a in x.items()}
        one, h1, h2 = _split_calls(tt.mlstm, t, 5, chunk_size=4, implementation=impl)
        h = torch.cat([h1, h2], dim=2) if chained else one
        (h * w).sum().backward()
        grads.append({n: a.grad.clone() for n, a in t.items()})
    for n in x:
        np.testing.assert_allclose(grads[1][n].numpy(), grads[0][n].numpy(), rtol=2e-4, atol=2e-5, err_msg=n)


def test_jax_gradients_flow_through_the_last_states():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import tessera.jax as tj
    x = {n: jnp.asarray(a) for n, a in problem(3).items() if n != "resets"}
    w = jnp.asarray(np.random.default_rng(4).standard_normal((B, NH, S, DV)).astype(np.float32))

    def loss(x, chained):
        one, h1, h2 = _split_calls(tj.mlstm, x, 5, chunk_size=4)
        return ((jnp.concatenate([h1, h2], axis=2) if chained else one) * w).sum()

    g1, g2 = jax.grad(loss)(x, False), jax.grad(loss)(x, True)
    for n in x:
        np.testing.assert_allclose(np.asarray(g2[n]), np.asarray(g1[n]), rtol=2e-4, atol=2e-5, err_msg=n)


def test_bool_and_uint8_resets_equal_int_resets():
    """A mask comes as bool (or uint8) from every framework; it is taken as int32 (nonzero = reset)."""
    x = problem(7)
    want = tessera.mlstm(**x, chunk_size=4)
    for dt in (np.bool_, np.uint8):
        np.testing.assert_array_equal(tessera.mlstm(**dict(x, resets=x["resets"].astype(dt)), chunk_size=4), want)
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    t = {n: torch.from_numpy(a) for n, a in x.items()}
    t["resets"] = t["resets"].bool()
    np.testing.assert_array_equal(tt.mlstm(**t, chunk_size=4).numpy(), want)
    jax = pytest.importorskip("jax")
    import tessera.jax as tj
    j = {n: jax.numpy.asarray(a) for n, a in x.items()}
    j["resets"] = j["resets"].astype(bool)
    np.testing.assert_array_equal(np.asarray(tj.mlstm(**j, chunk_size=4)), want)
