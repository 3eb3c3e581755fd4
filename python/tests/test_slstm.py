"""tessera.slstm from NumPy, PyTorch and JAX: the forward against the recurrence written in NumPy
(float64), gradients against the reference implementation's backward, resets, the initial and
last states, and errors."""
import numpy as np
import pytest

import tessera

B, S, NH, DH = 2, 5, 2, 4


def problem(seed=0, initial=False, resets=False):
    rng = np.random.default_rng(seed)
    d = {"wx": rng.uniform(-1, 1, (B, S, 4, NH, DH)).astype(np.float32),
         "r": (rng.uniform(-1, 1, (4, NH, DH, DH)) * 0.25).astype(np.float32),
         "b": rng.uniform(-0.5, 0.5, (4, NH, DH)).astype(np.float32)}
    if resets:
        rs = np.zeros((B, S), np.int32)
        rs[1, 2] = rs[0, 4] = 1
        d["resets"] = rs
    if initial:
        for n in ("h0", "c0", "m0"):
            d[n] = rng.uniform(-1, 1, (B, NH, DH)).astype(np.float32)
        d["n0"] = rng.uniform(0.5, 1.5, (B, NH, DH)).astype(np.float32)
    return d


def expected(d):
    """h and the last state (h, c, n, m), the recurrence of include/tessera/slstm.h in float64."""
    wx, r, b = (d[n].astype(np.float64) for n in ("wx", "r", "b"))
    init = "h0" in d
    h, c, n, m = (d[k].astype(np.float64) if init else np.zeros((B, NH, DH)) for k in ("h0", "c0", "n0", "m0"))
    out = np.zeros((B, S, NH, DH))
    for t in range(S):
        reset = d["resets"][:, t].astype(bool) if ("resets" in d and t > 0) else np.zeros(B, bool)
        h, c, n, m = (np.where(reset[:, None, None], 0.0, x) for x in (h, c, n, m))
        first = reset | (t == 0 and not init)
        pre = wx[:, t] + np.einsum("bhj,ghjk->bghk", h, r) + b
        i, f, z, o = pre[:, 0], pre[:, 1], pre[:, 2], pre[:, 3]
        lsf = np.minimum(f, 0) - np.log1p(np.exp(-np.abs(f)))
        fm = first[:, None, None]
        m_new = np.where(fm, i, np.maximum(i, m + lsf))
        I = np.where(fm, 1.0, np.exp(i - m_new))
        F = np.where(fm, 0.0, np.exp(m + lsf - m_new))
        c = F * c + I * np.tanh(z)
        n = F * n + I
        h = c / n / (1 + np.exp(-o))
        m = m_new
        out[:, t] = h
    return out, (h, c, n, m)


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("initial,resets", [(False, False), (True, True)])
def test_numpy_forward_and_last_states(impl, initial, resets):
    d = problem(initial=initial, resets=resets)
    want, last = expected(d)
    got = tessera.slstm(**d, return_last_states=True, implementation=impl)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1:], last):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    h = tessera.slstm(**d, implementation=impl)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)


def test_numpy_backward_cpu_matches_reference():
    d = problem(seed=2, initial=True, resets=True)
    dh = np.random.default_rng(9).standard_normal((B, S, NH, DH)).astype(np.float32)
    got = {i: tessera.call("slstm", "backward", {**d, "grad_h": dh}, implementation=i) for i in ("reference", "cpu")}
    for name in ("dwx", "dr", "db", "dh0", "dc0", "dn0"):
        np.testing.assert_allclose(got["cpu"][name], got["reference"][name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_numpy_errors():
    d = problem()
    with pytest.raises(ValueError, match=r"r must be \[4, NH="):
        tessera.slstm(d["wx"], d["r"][:, :, :3], d["b"])
    with pytest.raises(ValueError, match="together"):
        tessera.slstm(**d, h0=np.zeros((B, NH, DH), np.float32))
    with pytest.raises(ValueError, match="S = 0"):
        tessera.slstm(d["wx"][:, :0], d["r"], d["b"])


def test_torch_autograd_matches_reference_backward():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    d = problem(seed=3, initial=True, resets=True)
    dh = np.random.default_rng(4).standard_normal((B, S, NH, DH)).astype(np.float32)
    want = tessera.call("slstm", "backward", {**d, "grad_h": dh}, implementation="reference")
    t = {k: torch.from_numpy(v) for k, v in d.items()}
    for k in ("wx", "r", "b", "h0", "c0", "n0"):
        t[k].requires_grad_()
    h = tt.slstm(**t)
    (h * torch.from_numpy(dh)).sum().backward()
    np.testing.assert_allclose(h.detach().numpy(), expected(d)[0], rtol=1e-5, atol=1e-5)
    for k in ("wx", "r", "b", "h0", "c0", "n0"):
        np.testing.assert_allclose(t[k].grad.numpy(), want["d" + k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_torch_bf16_inputs_give_bf16_gradients():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt

    d = problem(seed=7)
    t = {k: torch.from_numpy(v).to(torch.bfloat16).requires_grad_() for k, v in d.items()}
    h = tt.slstm(**t)
    # h in the inputs' dtype (what the next bf16 layer takes): the f32 h rounded once; the states
    # are computed in f32 whatever the inputs' dtype
    assert h.dtype == torch.bfloat16
    h.sum().backward()
    rounded = {k: v.detach().float().numpy() for k, v in t.items()}
    want = tessera.call("slstm", "backward", {**rounded, "grad_h": np.ones((B, S, NH, DH), np.float32)},
                        implementation="reference")
    # one bf16 rounding of the f32 h (2^-9 relative) beside the kernel's f32 error (~1e-7)
    np.testing.assert_allclose(h.detach().float().numpy(), expected(rounded)[0], rtol=2 ** -8, atol=1e-6)
    for k in ("wx", "r", "b"):
        assert t[k].grad.dtype == torch.bfloat16
        # one bf16 rounding of the stored gradient: 2^-8 relative
        np.testing.assert_allclose(t[k].grad.float().numpy(), want["d" + k], rtol=2 ** -7, atol=1e-3, err_msg=k)


def test_jax_jit_and_grad():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    d = problem(seed=5, resets=True)
    dh = np.random.default_rng(6).standard_normal((B, S, NH, DH)).astype(np.float32)
    rs = jnp.asarray(d["resets"])

    def loss(wx, r, b):
        return jnp.sum(tj.slstm(wx, r, b, resets=rs) * dh)

    h = jax.jit(lambda wx, r, b: tj.slstm(wx, r, b, resets=rs))(d["wx"], d["r"], d["b"])
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(d["wx"], d["r"], d["b"])
    want = tessera.call("slstm", "backward", {**d, "grad_h": dh}, implementation="reference")
    np.testing.assert_allclose(np.asarray(h), expected(d)[0], rtol=1e-5, atol=1e-5)
    for got, name in zip(g, ("dwx", "dr", "db")):
        np.testing.assert_allclose(np.asarray(got), want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def _split_calls(fn, d, cut, **kw):
    """h of one call over S, and of two chained calls (the first's last state as the second's
    initial state) over [0, cut) and [cut, S)."""
    part = lambda a: a.contiguous() if hasattr(a, "contiguous") else a  # noqa: E731 - torch slices
    first = dict(d, wx=part(d["wx"][:, :cut]))
    second = dict(d, wx=part(d["wx"][:, cut:]))
    h1, hl, cl, nl, ml = fn(**first, return_last_states=True, **kw)
    h2 = fn(**second, h0=hl, c0=cl, n0=nl, m0=ml, **kw)
    return fn(**d, **kw), h1, h2


@pytest.mark.parametrize("impl", ["reference", "cpu"])
def test_torch_gradients_flow_through_the_last_states(impl):
    """Two chained calls give one call's gradients (h_last, c_last, n_last carry the second
    call's dh0, dc0, dn0 back into the first)."""
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    d = problem(5)
    w = torch.from_numpy(np.random.default_rng(6).standard_normal((B, S, NH, DH)).astype(np.float32))
    grads = []
    for chained in (False, True):
        t = {n: torch.from_numpy(a).requires_grad_() for n, a in d.items()}
        one, h1, h2 = _split_calls(tt.slstm, t, 2, implementation=impl)
        h = torch.cat([h1, h2], dim=1) if chained else one
        (h * w).sum().backward()
        grads.append({n: a.grad.clone() for n, a in t.items()})
    for n in d:
        np.testing.assert_allclose(grads[1][n].numpy(), grads[0][n].numpy(), rtol=2e-4, atol=2e-5, err_msg=n)


def test_jax_gradients_flow_through_the_last_states():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import tessera.jax as tj
    d = {n: jnp.asarray(a) for n, a in problem(5).items()}
    w = jnp.asarray(np.random.default_rng(6).standard_normal((B, S, NH, DH)).astype(np.float32))

    def loss(d, chained):
        one, h1, h2 = _split_calls(tj.slstm, d, 2)
        return ((jnp.concatenate([h1, h2], axis=1) if chained else one) * w).sum()

    g1, g2 = jax.grad(loss)(d, False), jax.grad(loss)(d, True)
    for n in d:
        np.testing.assert_allclose(np.asarray(g2[n]), np.asarray(g1[n]), rtol=2e-4, atol=2e-5, err_msg=n)


def test_bool_resets_equal_int_resets():
    d = problem(8, resets=True)
    want = tessera.slstm(**d)
    np.testing.assert_array_equal(tessera.slstm(**dict(d, resets=d["resets"].astype(bool))), want)
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    t = {n: torch.from_numpy(a) for n, a in d.items()}
    t["resets"] = t["resets"].to(torch.uint8)
    np.testing.assert_array_equal(tt.slstm(**t).numpy(), want)
