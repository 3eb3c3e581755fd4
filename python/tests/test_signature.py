"""What each kernel's declared signature brings to Python (issue #23): block sizes settable by
keyword (validated by the implementation that runs), saved outputs (lse) on request through
``return_<name>`` in NumPy, PyTorch and JAX (without a gradient through them), and docstrings
derived from the signature."""
import numpy as np
import pytest

import tessera
from tessera import _registry
from reference import loss as ref_loss, problem
from test_attention import expected, qkv


def ref_lse(x, w):
    z = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    m = z.max(-1, keepdims=True)
    return (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]


def test_numpy_lce_returns_lse_on_request():
    x, w, y = problem()
    loss = tessera.linear_cross_entropy(x, w, y, implementation="cpu")
    loss2, lse = tessera.linear_cross_entropy(x, w, y, implementation="cpu", return_lse=True)
    assert loss2 == loss
    kept = y != -100  # the lse of ignored rows is unspecified (the kernel skips them)
    np.testing.assert_allclose(lse[kept], ref_lse(x, w)[kept], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss, ref_loss(x, w, y), rtol=1e-5)


def test_numpy_attention_returns_lse_on_request():
    q, k, v = qkv()
    o, lse = tessera.attention(q, k, v, causal=True, return_lse=True, implementation="cpu")
    o_ref, lse_ref = expected(q, k, v, causal=True)
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-5, atol=1e-5)  # [B, Hq, Sq]


@pytest.mark.parametrize("kernel,sizes", [("grouped_matmul", "m=8,n=16"), ("attention", "q=4,kv=8"),
                                          ("linear_cross_entropy", "b=8,h=16,v=32")])
def test_block_sizes_keyword_gives_the_same_result(kernel, sizes):
    if kernel == "grouped_matmul":
        rng = np.random.default_rng(0)
        args = (rng.standard_normal((20, 12)).astype(np.float32), rng.standard_normal((3, 12, 40)).astype(np.float32),
                np.array([7, 0, 11], np.int64))
    elif kernel == "attention":
        args = qkv()
    else:
        args = problem()
    fn = getattr(tessera, kernel)
    default = fn(*args, implementation="cpu")
    tiled = fn(*args, implementation="cpu", block_sizes=sizes)
    # f32 accumulation in another tile order: a few ulps of the values' scale.
    np.testing.assert_allclose(np.asarray(tiled), np.asarray(default), rtol=1e-5, atol=1e-5)


def test_block_sizes_errors_name_the_problem():
    args = qkv()
    with pytest.raises(ValueError, match="block_sizes has no field 'm'"):
        tessera.attention(*args, implementation="cpu", block_sizes="q=4,kv=8,m=8")
    with pytest.raises(ValueError, match="not NAME=INTEGER"):
        tessera.attention(*args, implementation="cpu", block_sizes="q=4,kv")
    with pytest.raises(ValueError, match="block_sizes lacks kv"):
        tessera.attention(*args, implementation="cpu", block_sizes="q=4")
    with pytest.raises(Exception):  # a value the cpu backend refuses (validate_block_sizes)
        tessera.attention(*args, implementation="cpu", block_sizes="q=0,kv=8")


def test_docstrings_say_what_is_returned():
    assert "Returns loss" in tessera.linear_cross_entropy.__doc__
    assert "return_lse=True appends lse" in tessera.linear_cross_entropy.__doc__
    assert "Returns o" in tessera.attention.__doc__
    assert "(loss, argmax)" not in tessera.attention.__doc__
    assert "block_sizes" in tessera.grouped_matmul.__doc__
    # A forward-only kernel that declares no forward outputs returns all of them (it said "Returns .").
    assert "Returns every output of the forward" in tessera.mla_decode.__doc__
    for k in tessera.kernels():
        assert "Returns ." not in getattr(tessera, k["name"]).__doc__, k["name"]


def test_torch_lse_on_request_has_no_gradient():
    torch = pytest.importorskip("torch")
    import tessera.torch as tt
    x, w, y = (torch.from_numpy(a) for a in problem())
    x.requires_grad_(True)
    loss, lse = tt.linear_cross_entropy(x, w, y, return_lse=True)
    assert not lse.requires_grad
    kept = (y != -100).numpy()
    np.testing.assert_allclose(lse.numpy()[kept], ref_lse(x.detach().numpy(), w.numpy())[kept], rtol=1e-5, atol=1e-5)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_jax_lse_on_request_under_jit_and_grad():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import tessera.jax as tj
    x, w, y = problem()

    def f(x):
        loss, lse = tj.linear_cross_entropy(x, w, y, return_lse=True)
        return loss + lse.sum()  # lse carries no gradient (stop_gradient): the gradient is the loss's alone

    g = jax.jit(jax.grad(f))(jnp.asarray(x))
    g_ref = jax.grad(lambda x: tj.linear_cross_entropy(x, w, y))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=1e-6, atol=1e-7)
    _, lse = jax.jit(lambda x: tj.linear_cross_entropy(x, w, y, return_lse=True))(jnp.asarray(x))
    kept = y != -100
    np.testing.assert_allclose(np.asarray(lse)[kept], ref_lse(x, w)[kept], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", sorted(_registry.KERNELS))
def test_arguments_bind_as_the_signature_says(kernel):
    """Kernel.bind binds without inspect (its per-call cost was a third of a small NumPy call): for
    every kernel, the values of inspect's Signature.bind + apply_defaults, and a TypeError wherever
    inspect raises one (too many positional arguments, a keyword it does not know, a value given
    twice, a required input left out)."""
    import inspect
    k = _registry.KERNELS[kernel]
    frozen = inspect.Parameter("frozen", inspect.Parameter.KEYWORD_ONLY, default=())   # tessera.jax's extra
    for extra in ((), (frozen,)):
        sig = k.signature(extra)
        pos = [p.name for p in sig.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
        opt = next(o.name for o in k.options)
        calls = [(tuple(range(len(pos))), {}), (tuple(range(len(pos) - 1)), {pos[-1]: "kw"}),
                 (tuple(range(len(pos))), {opt: 7, "implementation": "x"}),
                 (tuple(range(len(pos) + 1)), {}), (tuple(range(len(pos))), {"no_such_option": 1}),
                 (tuple(range(len(pos))), {pos[0]: "twice"}), (tuple(range(len(pos) - 1)), {}),
                 (tuple(range(len(pos))), {"frozen": ("dx",)})]
        for args, kwargs in calls:
            try:
                b = sig.bind(*args, **kwargs)
            except TypeError:
                with pytest.raises(TypeError):
                    k._bound(args, kwargs, extra)
                continue
            b.apply_defaults()
            assert k._bound(args, kwargs, extra) == dict(b.arguments), (args, kwargs, extra)
