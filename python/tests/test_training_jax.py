"""The JAX counterpart of test_training.py: a small model that uses every differentiable kernel at
once, trained as JAX users train (a pure loss function of a parameter dict, jax.jit of
jax.value_and_grad, an optimizer written by hand), with the same model in jnp's own math as the
oracle, from the same initial weights.

One forward runs attention (GQA, causal, sliding window, soft cap), a top-1 mixture of experts on
grouped_matmul (both rhs layouts: transpose_rhs), an mLSTM block, an sLSTM block and the fused
linear cross-entropy head (label smoothing, z-loss, ignored tokens). The inputs reach the kernels
the way a model makes them: slices of one projection (q, k, v split off a fused qkv; the mLSTM's
[B, NH, S, DH] a transpose of [B, S, NH, DH]), the experts' rows a gather by a traced argsort with
group sizes of a static shape (one_hot(expert, E).sum(0), so the whole step jits), and the
gradients come back through reshapes and a scatter (.at[order].set). The unit tests check each
kernel against its oracle; this checks that they compose under jax.jit, jax.value_and_grad and an
optimizer:

1. loss and every parameter's gradient at the first step, jitted, against the jitted jnp model;
2. the loss over a few SGD-with-momentum steps, and that it decreases;
3. the un-jitted (eager) value_and_grad of the Tessera model against its jitted one.
"""
import functools
import math
import os

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tessera.jax as tj  # noqa: E402

from training_model import (B, D, DH, E, FF, H, HKV, HQ, IGNORE, NH, S, SMOOTH, V, ZLOSS,  # noqa: E402
                            reference_ops, tessera_ops)


# ---- jnp's own math: the oracle of each op, in the kernels' contracts ----

def attention_ref(q, k, v, causal, window_left, softcap):
    assert causal
    rep = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = softcap * jnp.tanh(s / softcap)
    i = jnp.arange(q.shape[1])[:, None] + (k.shape[1] - q.shape[1])
    j = jnp.arange(k.shape[1])[None, :]
    seen = (j <= i) & (j >= i - window_left)
    s = jnp.where(seen, s, -jnp.inf)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)


def gmm_ref(lhs, rhs, group_sizes, transpose_rhs=False):
    """Row r of lhs times the matrix of its group; rows past the sum are zero. Static shapes only
    (the group of each row from the cumulative sizes), so it jits with traced group sizes."""
    ends = jnp.cumsum(group_sizes)
    rows = jnp.arange(lhs.shape[0])
    group = jnp.searchsorted(ends, rows, side="right")
    w = rhs[jnp.minimum(group, rhs.shape[0] - 1)]                     # [M, K, N] or [M, N, K]
    out = jnp.einsum("mk,mnk->mn" if transpose_rhs else "mk,mkn->mn", lhs, w)
    return jnp.where((rows < ends[-1])[:, None], out, 0.0)


def mlstm_ref(q, k, v, i, f, eps=1e-6):
    """h [B, NH, S, DHV], the recurrence with the stabilizer held constant (the contract's backward).
    A lax.scan over the steps (an unrolled loop took XLA seconds to compile with its gradient)."""
    b_, nh, _, dk = q.shape

    def step(state, xs):
        C, n, m = state
        q_t, k_t, v_t, i_t, f_t = xs
        logf = jax.nn.log_sigmoid(f_t)
        m_new = jax.lax.stop_gradient(jnp.maximum(logf + m, i_t))
        Fg, Ig = jnp.exp(logf + m - m_new), jnp.exp(i_t - m_new)
        C = Fg[..., None, None] * C + Ig[..., None, None] * k_t[..., :, None] * v_t[..., None, :]
        n = Fg[..., None] * n + Ig[..., None] * k_t
        qs = q_t / math.sqrt(dk)
        den = jnp.maximum(jnp.abs((n * qs).sum(-1)), jnp.exp(-m_new)) + eps
        return (C, n, m_new), (C * qs[..., None]).sum(-2) / den[..., None]

    state = (jnp.zeros((b_, nh, dk, v.shape[-1]), q.dtype), jnp.zeros((b_, nh, dk), q.dtype),
             jnp.zeros((b_, nh), q.dtype))
    xs = tuple(jnp.moveaxis(a, 2, 0) for a in (q, k, v, i, f))
    return jnp.moveaxis(jax.lax.scan(step, state, xs)[1], 0, 2)


def slstm_ref(wx, r, b):
    """h [B, S, NH, DH] of include/tessera/slstm.h from the zero state (m held constant)."""

    def step(state, wx_t):
        h, c, n, m = state
        pre = wx_t + jnp.einsum("bhj,ghjk->bghk", h, r) + b
        i, f, z, o = pre[:, 0], pre[:, 1], pre[:, 2], pre[:, 3]
        if m is None:   # t = 0, no state yet: m = i, I = exp(i - m) = 1 with i's gradient kept, F = 0
            m_new = jax.lax.stop_gradient(i)
            Ig, Fg = jnp.exp(i - m_new), jnp.zeros_like(i)
            c = n = jnp.zeros_like(i)
        else:
            lsf = jax.nn.log_sigmoid(f)
            m_new = jax.lax.stop_gradient(jnp.maximum(i, m + lsf))
            Ig, Fg = jnp.exp(i - m_new), jnp.exp(m + lsf - m_new)
        c = Fg * c + Ig * jnp.tanh(z)
        n = Fg * n + Ig
        h = c / n * jax.nn.sigmoid(o)
        return (h, c, n, m_new), h

    b_, _, _, nh, dh = wx.shape
    state, h0 = step((jnp.zeros((b_, nh, dh), wx.dtype), None, None, None), wx[:, 0])
    hs = jax.lax.scan(step, state, jnp.moveaxis(wx[:, 1:], 1, 0))[1]
    return jnp.concatenate([h0[:, None], jnp.moveaxis(hs, 0, 1)], 1)


def lce_ref(x, w, labels):
    x, labels = x.reshape(-1, x.shape[-1]), labels.reshape(-1)
    z = x @ w.T
    lse = jax.nn.logsumexp(z, -1)
    keep = labels != IGNORE
    zy = jnp.take_along_axis(z, jnp.maximum(labels, 0)[:, None], 1)[:, 0]
    per = (1 - SMOOTH) * (lse - zy) + SMOOTH * (lse - z.mean(-1)) + ZLOSS * lse**2
    return jnp.where(keep, per, 0.0).sum() / keep.sum()


JnpOps = reference_ops(attention_ref, gmm_ref, mlstm_ref, slstm_ref, lce_ref)


TesseraOps = tessera_ops(tj)


# ---- the model: a pure function of a parameter dict ----

def init_params(seed=0):
    """Parameters as PyTorch initialises its modules (Linear weights [out, in]), from NumPy."""
    rng = np.random.default_rng(seed)

    def uniform(shape, fan_in):
        bound = 1 / math.sqrt(fan_in)
        return rng.uniform(-bound, bound, shape)

    p = {"embed": rng.standard_normal((V, H))}
    for l in range(5):
        # perturbed from (1, 0) so that a gain that multiplies the wrong thing shows
        p[f"norm{l}.w"] = 1 + 0.1 * rng.standard_normal(H)
        p[f"norm{l}.b"] = 0.1 * rng.standard_normal(H)
    for name, n_in, n_out, bias in (("qkv", H, (HQ + 2 * HKV) * D, True), ("attn_out", HQ * D, H, True),
                                    ("router", H, E, True), ("m_proj", H, 3 * NH * DH + 2 * NH, True),
                                    ("m_out", NH * DH, H, True), ("s_proj", H, 4 * NH * DH, True),
                                    ("s_out", NH * DH, H, True), ("lm_head", H, V, False)):
        p[f"{name}.w"] = uniform((n_out, n_in), n_in)
        if bias:
            p[f"{name}.b"] = uniform(n_out, n_in)
    p["w1"] = rng.standard_normal((E, H, FF)) / math.sqrt(H)      # [G, K, N]
    p["w2"] = rng.standard_normal((E, H, FF)) / math.sqrt(FF)     # [G, N, K]: transpose_rhs
    p["s_r"] = rng.standard_normal((4, NH, DH, DH)) * 0.2
    p["s_b"] = rng.standard_normal((4, NH, DH)) * 0.1
    return {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}


def linear(p, name, x):
    y = x @ p[f"{name}.w"].T
    return y + p[f"{name}.b"] if f"{name}.b" in p else y


def layer_norm(p, l, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * p[f"norm{l}.w"] + p[f"norm{l}.b"]


def attention_block(p, x, ops):
    qkv = linear(p, "qkv", x).reshape(B, S, HQ + 2 * HKV, D)   # q, k, v: slices of one projection
    q, k, v = qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]
    return linear(p, "attn_out", ops.attention(q, k, v).reshape(B, S, HQ * D))


def moe_block(p, x, ops):
    t = x.reshape(B * S, H)
    probs = jax.nn.softmax(linear(p, "router", t), -1)
    expert = jnp.argmax(probs, -1)
    gate = jnp.take_along_axis(probs, expert[:, None], 1)[:, 0]
    order = jnp.argsort(expert, stable=True)
    sizes = jax.nn.one_hot(expert, E, dtype=jnp.int32).sum(0)   # static shape [E]: jits
    h = jax.nn.gelu(ops.gmm(t[order], p["w1"], sizes), approximate=False)
    y = ops.gmm(h, p["w2"], sizes, transpose_rhs=True)
    return (jnp.zeros_like(t).at[order].set(y) * gate[:, None]).reshape(B, S, H)


def mlstm_block(p, x, ops):
    proj = linear(p, "m_proj", x)
    qkv = proj[..., :3 * NH * DH].reshape(B, S, 3, NH, DH).transpose(2, 0, 3, 1, 4)   # [3, B, NH, S, DH]
    gates = proj[..., 3 * NH * DH:].reshape(B, S, 2, NH).transpose(2, 0, 3, 1)        # [2, B, NH, S]
    h = ops.mlstm(qkv[0], qkv[1], qkv[2], gates[0], gates[1] + 2.0)
    return linear(p, "m_out", h.transpose(0, 2, 1, 3).reshape(B, S, NH * DH))


def slstm_block(p, x, ops):
    wx = linear(p, "s_proj", x).reshape(B, S, 4, NH, DH)
    return linear(p, "s_out", ops.slstm(wx, p["s_r"], p["s_b"]).reshape(B, S, NH * DH))


def loss(params, tokens, labels, ops):
    x = params["embed"][tokens]
    for l, block in enumerate((attention_block, moe_block, mlstm_block, slstm_block)):
        x = x + block(params, layer_norm(params, l, x), ops)
    return ops.lce(layer_norm(params, 4, x), params["lm_head.w"], labels)


def batch(step):
    rng = np.random.default_rng(100 + step)
    tokens = rng.integers(0, V, (B, S))
    labels = (tokens * 7 + 3) % V
    labels[:, -1] = IGNORE                                  # ignored tokens
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(labels, jnp.int32)


@functools.lru_cache(maxsize=None)
def value_and_grad(ops, jit=True):
    f = jax.value_and_grad(functools.partial(loss, ops=ops))
    return jax.jit(f) if jit else f


def relative_errors(got, want):
    """Per parameter: max |got - want| / max |want|."""
    assert got.keys() == want.keys()
    return {n: float(jnp.abs(got[n] - want[n]).max() / jnp.abs(want[n]).max()) for n in want}


def assert_gradients_close(got, want, rtol, what):
    assert got.keys() == want.keys()
    for name in want:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape, f"{what}: {name}: shape {g.shape} != {w.shape}"
        scale = np.abs(w).max()
        err = np.abs(g - w).max()
        assert err <= rtol * scale + 1e-7, f"{what}: {name}: max |Δ| {err:.3g} against max |grad| {scale:.3g}"


def test_first_step_loss_and_every_gradient_match_jnp():
    params = init_params()
    loss_, grads = value_and_grad(TesseraOps)(params, *batch(0))
    want_loss, want = value_and_grad(JnpOps)(params, *batch(0))
    assert float(loss_) == pytest.approx(float(want_loss), rel=1e-5)
    # f32 throughout; the kernels sum in other orders (tiles, chunks) than the einsums. Measured
    # on the CPU (2 cores): at most 5.6e-7 of each gradient's largest entry (the torch version:
    # 6.2e-7); 1e-5 leaves ~18x. A gradient lost at one step of one kernel (the sLSTM's i at
    # t = 0, say) is off by 1e-1 everywhere upstream of it.
    assert_gradients_close(grads, want, 1e-5, "jit")
    assert all(float(jnp.abs(g).max()) > 0 for g in want.values())   # every kernel's gradient reached a weight


def sgd_losses(ops, steps=6, lr=0.05, momentum=0.9):
    """PyTorch's SGD with momentum: buf = momentum·buf + g (buf = g at the first step), p -= lr·buf."""
    step_fn = value_and_grad(ops)

    @jax.jit
    def update(params, bufs, grads):
        bufs = jax.tree.map(lambda b, g: momentum * b + g, bufs, grads)
        return jax.tree.map(lambda p, b: p - lr * b, params, bufs), bufs

    params, losses = init_params(), []
    bufs = jax.tree.map(jnp.zeros_like, params)
    for step in range(steps):
        value, grads = step_fn(params, *batch(step))
        params, bufs = update(params, bufs, grads)
        losses.append(float(value))
    return losses


def test_sgd_steps_follow_jnp():
    mine, ref = sgd_losses(TesseraOps), sgd_losses(JnpOps)
    np.testing.assert_allclose(mine, ref, rtol=1e-4)
    assert mine[-1] < mine[0]                                # it learns (the rule is learnable)


def test_eager_value_and_grad_matches_jit():
    params = init_params()
    want_loss, want = value_and_grad(TesseraOps)(params, *batch(0))
    loss_, got = value_and_grad(TesseraOps, jit=False)(params, *batch(0))
    # the kernels are the same calls either way; XLA's fusion of the jnp glue (layer norms,
    # softmax, GELU, the linears' bias sums) sums in other orders: measured at most 6.7e-7 of a
    # gradient's largest entry (m_proj.w), the loss equal; 5e-6 leaves ~7x
    assert float(loss_) == pytest.approx(float(want_loss), rel=1e-6)
    assert_gradients_close(got, want, 5e-6, "eager")


def loss_rematerialized(params, tokens, labels, ops, policy=None):
    """loss() with every block and the head under jax.checkpoint (rematerialized in the backward:
    the kernels' forward calls run again inside the VJP)."""
    x = params["embed"][tokens]
    for l, block in enumerate((attention_block, moe_block, mlstm_block, slstm_block)):
        f = jax.checkpoint(lambda p, a, l=l, block=block: block(p, layer_norm(p, l, a), ops), policy=policy)
        x = x + f(params, x)
    head = jax.checkpoint(lambda p, a: ops.lce(layer_norm(p, 4, a), p["lm_head.w"], labels), policy=policy)
    return head(params, x)


@pytest.mark.parametrize("policy", [None, "dots_saveable"])
def test_rematerialization_gives_the_gradients(policy):
    """jax.checkpoint (remat) of every block and of the head, with the default policy (nothing
    saved) and with dots saveable: the jitted gradients of the plain model. Measured on the CPU:
    the loss equal, gradients within 3.0e-8 (XLA fuses the recomputed glue differently); 5e-6 of
    each gradient's largest entry, as eager against jit."""
    params = init_params()
    want_loss, want = value_and_grad(TesseraOps)(params, *batch(0))
    pol = getattr(jax.checkpoint_policies, policy) if policy else None
    f = jax.jit(jax.value_and_grad(functools.partial(loss_rematerialized, ops=TesseraOps, policy=pol)))
    got_loss, got = f(params, *batch(0))
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-6)
    assert_gradients_close(got, want, 5e-6, f"remat {policy}")


def _gpu():
    try:
        return jax.devices("gpu")[0]
    except RuntimeError:
        return None


@pytest.mark.skipif(_gpu() is None and os.environ.get("TESSERA_REQUIRE_CUDA") != "1",
                    reason="JAX sees no GPU")
def test_first_step_on_gpu_matches_jnp_on_cpu():
    """The jitted training step with its arrays on the GPU (the kernels' cuda implementations
    through the XLA FFI's CUDA handler; group sizes read on the host) against the jnp model on
    the CPU. 2e-3 of each gradient's largest entry, as test_cuda.py: other summation orders, and
    f32 products in TF32 where cuBLAS or a kernel uses it."""
    cpu, gpu = jax.devices("cpu")[0], jax.devices("gpu")[0]
    params = init_params()
    want_loss, want = value_and_grad(JnpOps)(jax.device_put(params, cpu), *jax.device_put(batch(0), cpu))
    with jax.default_matmul_precision("highest"):   # the jnp glue's matmuls in f32, not TF32: no router near-tie flips
        loss_, grads = value_and_grad(TesseraOps)(jax.device_put(params, gpu), *jax.device_put(batch(0), gpu))
    assert all(g.devices() == {gpu} for g in grads.values())
    assert float(loss_) == pytest.approx(float(want_loss), rel=2e-3)
    assert_gradients_close(grads, want, 2e-3, "gpu")
