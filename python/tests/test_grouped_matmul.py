"""tessera.grouped_matmul from NumPy, PyTorch and JAX: values and gradients against the same math
written with per-group matrix products, the megablox conventions (rows past the sum are zero, the
group offset), and errors."""
import numpy as np
import pytest

import tessera


def problem(M=37, K=12, N=9, sizes=(5, 0, 17, 1, 9), seed=0, transpose=False, local=None):
    rng = np.random.default_rng(seed)
    G = len(sizes) if local is None else local
    lhs = rng.standard_normal((M, K)).astype(np.float32)
    rhs = rng.standard_normal((G, N, K) if transpose else (G, K, N)).astype(np.float32)
    return lhs, rhs, np.array(sizes, np.int32)


def expected(lhs, rhs, sizes, dout=None, transpose=False, offset=None):
    """out, dlhs, drhs with per-group products in float64."""
    lhs64, rhs64 = lhs.astype(np.float64), rhs.astype(np.float64)
    mats = rhs64.transpose(0, 2, 1) if transpose else rhs64
    M, N = lhs.shape[0], mats.shape[2]
    dout = np.ones((M, N)) if dout is None else dout.astype(np.float64)
    out, dlhs, drhs = np.zeros((M, N)), np.zeros_like(lhs64), np.zeros_like(mats)
    start = np.concatenate([[0], np.cumsum(sizes)])
    first = 0 if offset is None else offset
    for g in range(mats.shape[0]):
        rows = slice(start[first + g], start[first + g + 1])
        out[rows] = lhs64[rows] @ mats[g]
        dlhs[rows] = dout[rows] @ mats[g].T
        drhs[g] = lhs64[rows].T @ dout[rows]
    return out, dlhs, (drhs.transpose(0, 2, 1) if transpose else drhs)


@pytest.mark.parametrize("impl", ["reference", "cpu"])
@pytest.mark.parametrize("transpose", [False, True])
def test_numpy_forward_and_backward(impl, transpose):
    lhs, rhs, sizes = problem(transpose=transpose)
    out = tessera.grouped_matmul(lhs, rhs, sizes, transpose_rhs=transpose, implementation=impl)
    want, dl, dr = expected(lhs, rhs, sizes, transpose=transpose)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert np.all(out[32:] == 0)  # rows past the sum (32 of 37)
    dout = np.random.default_rng(3).standard_normal(out.shape).astype(np.float32)
    got = tessera.call("grouped_matmul", "backward", {"lhs": lhs, "rhs": rhs, "group_sizes": sizes, "grad_out": dout},
                       transpose_rhs=transpose, implementation=impl)
    _, dl, dr = expected(lhs, rhs, sizes, dout, transpose=transpose)
    np.testing.assert_allclose(got["dlhs"], dl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["drhs"], dr, rtol=1e-5, atol=1e-5)


def test_numpy_group_offset_and_errors():
    lhs, rhs, sizes = problem(sizes=(4, 7, 0, 6, 5), local=2)
    out = tessera.grouped_matmul(lhs, rhs, sizes, group_offset=2)
    want, _, _ = expected(lhs, rhs, sizes, offset=2)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="group_offset"):
        tessera.grouped_matmul(lhs, rhs, sizes)  # 5 sizes for 2 matrices
    with pytest.raises(ValueError, match="negative"):
        tessera.grouped_matmul(lhs, rhs, np.array([3, -1], np.int32))
    with pytest.raises(ValueError, match="sum past M"):
        tessera.grouped_matmul(lhs, rhs, np.array([30, 30], np.int64))
    with pytest.raises(TypeError):
        tessera.grouped_matmul(lhs, rhs.astype(np.float64), np.array([3, 1], np.int32))


def test_torch_autograd_matches_per_group_math():
    torch = pytest.importorskip("torch")
    lhs, rhs, sizes = problem(seed=1)
    L = torch.from_numpy(lhs).requires_grad_()
    R = torch.from_numpy(rhs).requires_grad_()
    out = tessera.grouped_matmul(L, R, torch.from_numpy(sizes))
    dout = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * dout).sum().backward()
    want, dl, dr = expected(lhs, rhs, sizes, dout.numpy())
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(L.grad.numpy(), dl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(R.grad.numpy(), dr, rtol=1e-5, atol=1e-5)


def test_torch_bf16_takes_f32_upstream_gradients():
    torch = pytest.importorskip("torch")
    lhs, rhs, sizes = problem(seed=2)
    L = torch.from_numpy(lhs).to(torch.bfloat16).requires_grad_()
    R = torch.from_numpy(rhs).to(torch.bfloat16).requires_grad_()
    out = tessera.grouped_matmul(L, R, torch.from_numpy(sizes))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    _, dl, dr = expected(L.detach().float().numpy(), R.detach().float().numpy(), sizes)
    np.testing.assert_allclose(L.grad.float().numpy(), dl, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(R.grad.float().numpy(), dr, rtol=2e-2, atol=2e-2)


def test_jax_jit_and_grad():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj

    lhs, rhs, sizes = problem(seed=4)
    dout = np.random.default_rng(5).standard_normal((lhs.shape[0], rhs.shape[2])).astype(np.float32)

    def loss(l, r):
        return jnp.sum(tj.grouped_matmul(l, r, jnp.asarray(sizes)) * dout)

    out = jax.jit(lambda l, r: tj.grouped_matmul(l, r, jnp.asarray(sizes)))(lhs, rhs)
    gl, gr = jax.jit(jax.grad(loss, argnums=(0, 1)))(lhs, rhs)
    want, dl, dr = expected(lhs, rhs, sizes, dout)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gl), dl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(gr), dr, rtol=1e-5, atol=1e-5)


def test_torch_frozen_experts_skip_drhs(monkeypatch):
    """Frozen expert weights (LoRA on an MoE): the backward op is asked to skip drhs and dlhs is
    the bits of the all-trainable run; a frozen lhs skips dlhs likewise."""
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    from tessera import _ext

    lhs, rhs, sizes = problem(seed=6)
    dout = torch.from_numpy(np.random.default_rng(7).standard_normal((lhs.shape[0], rhs.shape[2])).astype(np.float32))
    full = [torch.from_numpy(lhs).requires_grad_(), torch.from_numpy(rhs).requires_grad_()]
    tt.grouped_matmul(full[0], full[1], torch.from_numpy(sizes)).backward(dout)
    seen = []
    real = _ext.call
    monkeypatch.setattr(_ext, "call", lambda *a, **k: seen.append((a[1], k.get("skip"))) or real(*a, **k))
    for frozen in (1, 0):
        part = [torch.from_numpy(lhs).requires_grad_(frozen != 0), torch.from_numpy(rhs).requires_grad_(frozen != 1)]
        tt.grouped_matmul(part[0], part[1], torch.from_numpy(sizes)).backward(dout)
        assert ("backward", [["dlhs"], ["drhs"]][frozen]) in seen, seen
        assert part[frozen].grad is None
        assert torch.equal(part[1 - frozen].grad, full[1 - frozen].grad)
    with pytest.raises(ValueError, match=r"cannot skip 'dout'"):
        tessera.call("grouped_matmul", "backward", {"lhs": lhs, "rhs": rhs, "group_sizes": sizes,
                                                    "grad_out": dout.numpy()}, skip=["dout"])


def test_no_rows_from_every_front_end():
    """An expert-parallel rank that received no token (M = 0): out [0, N], drhs zero. The cpu
    backend's f32 route divided by M (SIGFPE: the Python process died, from NumPy, torch and
    JAX's backward; a reviewer's finding)."""
    lhs, rhs, sizes = np.zeros((0, 8), np.float32), np.ones((2, 8, 5), np.float32), np.zeros(2, np.int32)
    out = tessera.grouped_matmul(lhs, rhs, sizes)
    assert out.shape == (0, 5)
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    r = torch.ones(2, 8, 5, requires_grad=True)
    o = tt.grouped_matmul(torch.zeros(0, 8), r, torch.zeros(2, dtype=torch.long))
    o.sum().backward()
    assert o.shape == (0, 5) and torch.equal(r.grad, torch.zeros(2, 8, 5))
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    g = jax.grad(lambda w: tj.grouped_matmul(jnp.zeros((0, 8)), w, jnp.zeros(2, jnp.int32)).sum())(jnp.ones((2, 8, 5)))
    np.testing.assert_array_equal(np.asarray(g), np.zeros((2, 8, 5), np.float32))
