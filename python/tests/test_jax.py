"""tessera.jax: XLA FFI + custom_vjp, values and gradients against JAX's own autodiff of the
materialized loss, under jit and grad."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tessera  # noqa: E402
import tessera.jax as tj  # noqa: E402

import reference as ref  # noqa: E402


def materialized(x, w, y, bias=None, token_weights=None, reduction="mean", ignore_index=-100,
                 label_smoothing=0.0, z_loss_weight=0.0, softcap=0.0):
    """The loss as JAX users write it: logits, jax.nn.logsumexp, then the options."""
    z = (x @ w.T).astype(jnp.float32)
    if bias is not None:
        z = z + bias
    if softcap:
        z = softcap * jnp.tanh(z / softcap)
    lse = jax.nn.logsumexp(z, axis=-1)
    keep = y != ignore_index
    zy = jnp.take_along_axis(z, jnp.where(keep, y, 0)[..., None], axis=-1)[..., 0]
    ce = (1 - label_smoothing) * (lse - zy) + label_smoothing * (lse - z.mean(-1))
    tw = jnp.ones_like(lse) if token_weights is None else token_weights
    per = jnp.where(keep, tw * (ce + z_loss_weight * lse**2), 0.0)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / jnp.maximum((tw * keep).sum(), 1e-30)


OPTIONS = [
    {},
    {"reduction": "sum"},
    {"label_smoothing": 0.1},
    {"z_loss_weight": 1e-3},
    {"softcap": 5.0},
    {"reduction": "sum", "label_smoothing": 0.2, "z_loss_weight": 1e-2, "softcap": 3.0},
]


def arrays(seed=0, bias=False):
    x, w, y = ref.problem(seed=seed)
    out = [jnp.asarray(x), jnp.asarray(w), jnp.asarray(y.astype(np.int32))]
    if bias:
        out.append(jnp.asarray(np.random.default_rng(seed).standard_normal(w.shape[0]).astype(np.float32)))
    return out


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_value_and_grad_under_jit(opts):
    x, w, y, b = arrays(bias=True)

    def ours(x, w, b):
        return tj.linear_cross_entropy(x, w, y, bias=b, **opts)

    def theirs(x, w, b):
        return materialized(x, w, y, bias=b, **opts)

    v, g = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))(x, w, b)
    rv, rg = jax.value_and_grad(theirs, argnums=(0, 1, 2))(x, w, b)
    np.testing.assert_allclose(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=2e-6)


def test_soft_cap_is_the_older_spelling_of_softcap():
    """soft_cap= (linear_cross_entropy's name until 2026-11-29) keeps working under jit and grad."""
    x, w, y = arrays()
    f = lambda name: jax.jit(jax.value_and_grad(lambda w: tj.linear_cross_entropy(x, w, y, **{name: 3.0})))(w)  # noqa: E731
    (new_v, new_g), (old_v, old_g) = f("softcap"), f("soft_cap")
    assert new_v == old_v and jnp.array_equal(new_g, old_g)
    assert new_v != tj.linear_cross_entropy(x, w, y)
    with pytest.raises(TypeError, match="older spelling"):
        tj.linear_cross_entropy(x, w, y, softcap=3.0, soft_cap=3.0)


def test_reduction_none_vjp_with_a_nonuniform_cotangent():
    x, w, y = arrays()
    ct = jnp.linspace(0.5, 2.0, y.shape[0])
    ours = jax.vjp(lambda x, w: tj.linear_cross_entropy(x, w, y, reduction="none"), x, w)
    theirs = jax.vjp(lambda x, w: materialized(x, w, y, reduction="none"), x, w)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=2e-5, atol=1e-6)
    for a, r in zip(ours[1](ct), theirs[1](ct)):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=2e-6)


def test_token_weights_leading_axes_and_argmax():
    x, w, y = arrays()
    tw = jnp.asarray(np.random.default_rng(3).random(y.shape[0]).astype(np.float32))
    f = jax.jit(lambda x, w: tj.linear_cross_entropy(x.reshape(4, 6, -1), w, y.reshape(4, 6),
                                                     token_weights=tw.reshape(4, 6), return_argmax=True))
    loss, am = f(x, w)
    np.testing.assert_allclose(loss, materialized(x, w, y, token_weights=tw), rtol=2e-5)
    assert am.shape == (4, 6)
    np.testing.assert_array_equal(am.reshape(-1), jnp.argmax(x @ w.T, -1))
    gx = jax.grad(lambda x: tj.linear_cross_entropy(x, w, y, token_weights=tw))(x)
    np.testing.assert_allclose(gx, jax.grad(lambda x: materialized(x, w, y, token_weights=tw))(x), rtol=1e-4, atol=2e-6)


def test_bf16():
    x, w, y = arrays()
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    v, (gx, gw) = jax.jit(jax.value_and_grad(lambda x, w: tj.linear_cross_entropy(x, w, y), argnums=(0, 1)))(xb, wb)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16
    x32, w32 = xb.astype(jnp.float32), wb.astype(jnp.float32)
    rv, (rx, rw) = jax.value_and_grad(lambda x, w: materialized(x, w, y), argnums=(0, 1))(x32, w32)
    np.testing.assert_allclose(v, rv, rtol=1e-3)
    np.testing.assert_allclose(gx.astype(jnp.float32), rx, rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(gw.astype(jnp.float32), rw, rtol=2e-2, atol=2e-3)


def test_jitted_training_step_matches_jax():
    x, w, y = arrays()

    def step(loss_fn):
        @jax.jit
        def s(w):
            l, g = jax.value_and_grad(lambda w: loss_fn(x, w, y))(w)
            return w - 0.5 * g, l
        return s

    ours, theirs = step(tj.linear_cross_entropy), step(materialized)
    wo, wt = w, w
    losses = []
    for _ in range(5):
        wo, lo = ours(wo)
        wt, lt = theirs(wt)
        np.testing.assert_allclose(lo, lt, rtol=1e-4)
        losses.append(float(lo))
    np.testing.assert_allclose(wo, wt, rtol=1e-4, atol=1e-5)
    assert losses[-1] < losses[0]


def test_an_ffi_custom_call_not_a_callback():
    x, w, y = arrays()
    hlo = jax.jit(jax.grad(lambda x: tj.linear_cross_entropy(x, w, y))).lower(x).as_text()
    assert "custom_call @tessera_call" in hlo
    assert "callback" not in hlo


def test_a_cuda_ffi_handler_in_every_build():
    """JAX arrays on a GPU need the CUDA handler. It links no CUDA runtime, so every build has it
    (until 2026-11-28 it hid behind a macro nothing defined, and JAX on a GPU found no handler);
    without the CUDA module a call says why."""
    assert set(tessera._ext.ffi_targets()) == {"cpu", "cuda"}


def test_top_level_function_dispatches_jax_arrays():
    x, w, y = arrays()
    got = tessera.linear_cross_entropy(x, w, y)
    assert isinstance(got, jax.Array)
    np.testing.assert_allclose(got, materialized(x, w, y), rtol=2e-5)


def test_bad_inputs_raise():
    x, w, y = arrays()
    with pytest.raises(TypeError, match="w dtype bf16 differs from x dtype f32"):
        tj.linear_cross_entropy(x, w.astype(jnp.bfloat16), y)
    with pytest.raises(TypeError, match="labels must be i32 or i64, got f32"):
        tj.linear_cross_entropy(x, w, y.astype(jnp.float32))
    with pytest.raises(ValueError, match="labels shape \\[23\\] does not match"):
        jax.jit(lambda x: tj.linear_cross_entropy(x, w, y[:23]))(x)
    with pytest.raises(ValueError, match="reduction must be one of"):
        tj.linear_cross_entropy(x, w, y, reduction="avg")


def test_metric_outputs_under_jit_and_grad():
    """return_z_loss / return_token_accuracy under jit; grad of the loss is unchanged by them."""
    x, w, y = arrays()
    lam = 1e-2

    def with_metrics(x, w):
        return tj.linear_cross_entropy(x, w, y, z_loss_weight=lam, return_z_loss=True, return_token_accuracy=True)

    loss, z_loss, acc = jax.jit(with_metrics)(x, w)
    z = x @ w.T
    lse = jax.nn.logsumexp(z, axis=-1)
    kept = y != -100
    np.testing.assert_allclose(z_loss, lam * float((jnp.where(kept, lse**2, 0.0)).sum() / kept.sum()), rtol=1e-5)
    np.testing.assert_allclose(acc, float(jnp.where(kept, z.argmax(-1) == y, False).sum() / kept.sum()), rtol=1e-6)
    g = jax.grad(lambda x, w: with_metrics(x, w)[0])(x, w)
    g_plain = jax.grad(lambda x, w: tj.linear_cross_entropy(x, w, y, z_loss_weight=lam))(x, w)
    np.testing.assert_allclose(g, g_plain, rtol=1e-6, atol=1e-8)


# --- Fused pass in the fwd rule (reduction sum / mean) --------------------------------------------

def forward_then_backward(x, w, y, b, g, **opts):
    """Today's pair of passes by hand: forward (keeping lse), then backward with grad_loss=g."""
    t = {"x": x, "w": w, "labels": y, "bias": b}
    fw = tj.call("linear_cross_entropy", "forward", t, **opts)
    bw = tj.call("linear_cross_entropy", "backward",
                 dict(t, grad_loss=jnp.asarray(g, jnp.float32), lse=fw["lse"]), **opts)
    return fw["loss"], (bw["dx"], bw["dw"], bw["dbias"])


FUSED_OPTIONS = [
    {"reduction": "mean"},
    {"reduction": "sum"},
    {"reduction": "mean", "label_smoothing": 0.1, "z_loss_weight": 1e-3},
    {"reduction": "sum", "label_smoothing": 0.2, "z_loss_weight": 1e-2, "softcap": 3.0},
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("opts", FUSED_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_fused_in_fwd_rule_matches_forward_then_backward(dtype, opts):
    x, w, y, b = arrays(seed=3, bias=True)  # labels have ignore_index rows (every 5th)
    x, w, b = x.astype(dtype), w.astype(dtype), b.astype(dtype)
    f = jax.jit(jax.value_and_grad(lambda x, w, b: tj.linear_cross_entropy(x, w, y, bias=b, **opts), argnums=(0, 1, 2)))
    assert "('pass_', 'fused')" in str(jax.make_jaxpr(jax.grad(lambda x: tj.linear_cross_entropy(x, w, y, **opts)))(x))
    v, grads = f(x, w, b)
    rv, rgrads = forward_then_backward(x, w, y, b, 1.0, **opts)
    np.testing.assert_array_equal(v, rv)  # the fused pass's loss is the forward's, bit for bit
    for a, r in zip(grads, rgrads):
        assert a.dtype == r.dtype == dtype
        # As in test_torch: the fused and backward passes order some f32 operations differently
        # (1 f32 ulp of the summed terms where they cancel; one bf16 rounding may flip).
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        tol = dict(rtol=1e-6, atol=1e-8) if dtype == jnp.float32 else dict(rtol=2 ** -8, atol=1e-6)
        np.testing.assert_allclose(a, r, **tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_fused_in_fwd_rule_scales_by_the_cotangent(dtype):
    x, w, y, b = arrays(seed=3, bias=True)
    x, w, b = x.astype(dtype), w.astype(dtype), b.astype(dtype)
    fn = lambda x, w, b: tj.linear_cross_entropy(x, w, y, bias=b, reduction="sum", label_smoothing=0.1)  # noqa: E731
    _, vjp = jax.vjp(fn, x, w, b)
    one, three = vjp(jnp.float32(1.0)), jax.jit(vjp)(jnp.float32(3.0))
    for a, o in zip(three, one):  # the saved gradients times 3, in f32, rounded once to the dtype
        np.testing.assert_array_equal(a, (o.astype(jnp.float32) * 3.0).astype(dtype))
    _, rgrads = forward_then_backward(x, w, y, b, 3.0, reduction="sum", label_smoothing=0.1)
    for a, r in zip(three, rgrads):  # tolerance relative to the gradient's scale: see test_torch
        a, r = np.asarray(a, np.float32), np.asarray(r, np.float32)
        scale = float(np.abs(r).max())
        tol = dict(rtol=1e-5, atol=1e-6 * scale) if dtype == jnp.float32 else dict(rtol=2 ** -7, atol=2 ** -6 * scale)
        np.testing.assert_allclose(a, r, **tol)


def test_forward_only_without_grad_and_for_reduction_none():
    x, w, y = arrays()
    assert "('pass_', 'fused')" not in str(jax.make_jaxpr(lambda x: tj.linear_cross_entropy(x, w, y))(x))
    per_token = jax.make_jaxpr(jax.grad(lambda x: tj.linear_cross_entropy(x, w, y, reduction="none").sum()))(x)
    assert "('pass_', 'fused')" not in str(per_token) and "('pass_', 'backward')" in str(per_token)


def _record_ffi_skips(monkeypatch):
    """(pass, sorted skip) of every FFI call tessera.jax traces from now on."""
    seen = []
    real = tj._ffi

    def spy(k, pass_, tensors, options, ex, skip=()):
        seen.append((pass_, sorted(skip)))
        return real(k, pass_, tensors, options, ex, skip)

    monkeypatch.setattr(tj, "_ffi", spy)
    return seen


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("frozen", [("w",), ("x",), ("bias", "w")], ids=["w", "x", "w,bias"])
def test_frozen_inputs_skip_their_gradients(monkeypatch, reduction, frozen):
    """frozen= (a frozen lm_head under LoRA: frozen="w") asks the kernel to skip those gradients
    (the fused pass of a scalar loss, the backward for reduction 'none'); their cotangent is zero,
    and the gradients it computes are the same bits as with nothing frozen."""
    x, w, y, b = arrays(seed=3, bias=True)
    up = jnp.linspace(0.5, 2.0, y.size).reshape(y.shape)

    def loss(x, w, b, **kw):
        out = tj.linear_cross_entropy(x, w, y, bias=b, reduction=reduction, **kw)
        return out if reduction == "mean" else (out * up).sum()

    full = jax.grad(loss, argnums=(0, 1, 2))(x, w, b)
    seen = _record_ffi_skips(monkeypatch)
    part = jax.jit(jax.grad(lambda x, w, b: loss(x, w, b, frozen=frozen), argnums=(0, 1, 2)))(x, w, b)
    want = ("fused" if reduction == "mean" else "backward", sorted("d" + n for n in frozen))
    assert want in seen, seen
    for n, g, r in zip(("x", "w", "bias"), part, full):
        if n in frozen:
            assert not np.any(np.asarray(g)), n
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(r), err_msg=n)


def test_nothing_frozen_skips_nothing_and_bad_names_are_refused(monkeypatch):
    x, w, y = arrays(seed=5)
    seen = _record_ffi_skips(monkeypatch)
    jax.grad(lambda x, w: tj.linear_cross_entropy(x, w, y, frozen="w"), argnums=(0, 1))(x, w)
    jax.grad(lambda x, w: tj.linear_cross_entropy(x, w, y), argnums=(0, 1))(x, w)
    assert seen == [("fused", ["dw"]), ("fused", [])], seen
    with pytest.raises(ValueError, match=r"frozen='labels'.*\(frozen: x, w, bias\)"):
        tj.linear_cross_entropy(x, w, y, frozen=("labels",))
    import inspect
    assert "frozen=()" in str(inspect.signature(tj.grouped_matmul))
    assert "frozen=()" in str(inspect.signature(tj.attention))  # dbias
    assert "frozen" not in str(inspect.signature(tj.mlstm))  # nothing skippable there


def test_grouped_matmul_frozen_experts_skip_drhs(monkeypatch):
    rng = np.random.default_rng(7)
    lhs = jnp.asarray(rng.standard_normal((10, 6)).astype(np.float32))
    rhs = jnp.asarray(rng.standard_normal((3, 6, 5)).astype(np.float32))
    sizes = jnp.asarray(np.array([4, 0, 6], np.int32))
    up = jnp.asarray(rng.standard_normal((10, 5)).astype(np.float32))

    def loss(lhs, rhs, **kw):
        return (tj.grouped_matmul(lhs, rhs, sizes, **kw) * up).sum()

    full = jax.grad(loss, argnums=(0, 1))(lhs, rhs)
    seen = _record_ffi_skips(monkeypatch)
    dl, dr = jax.grad(lambda a, b: loss(a, b, frozen="rhs"), argnums=(0, 1))(lhs, rhs)
    assert ("backward", ["drhs"]) in seen, seen
    np.testing.assert_array_equal(np.asarray(dl), np.asarray(full[0]))
    assert not np.any(np.asarray(dr))


def test_vjps_in_different_inputs_of_one_jitted_loss():
    """Two vjps of one jitted call site, in x then in w, the first pulled back last: JAX keeps one
    residual structure per call site for every pattern of differentiated inputs, so nothing in
    the residuals may depend on the pattern (a symbolic_zeros version that skipped the
    undifferentiated inputs' gradients returned x's as zeros here, silently: not landed)."""
    x, w, y = arrays(seed=6)
    up = jnp.linspace(0.5, 2.0, y.size).reshape(y.shape)
    jl = jax.jit(lambda x, w: tj.linear_cross_entropy(x, w, y, reduction="none"))
    _, vx = jax.vjp(lambda x: jl(x, w), x)
    _, vw = jax.vjp(lambda w: jl(x, w), w)
    dx, = vx(up)
    dw, = vw(up)
    want = jax.vjp(lambda x, w: tj.linear_cross_entropy(x, w, y, reduction="none"), x, w)[1](up)
    np.testing.assert_array_equal(np.asarray(dx), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(dw), np.asarray(want[1]))


def test_inside_an_unjitted_shard_map():
    """Forward and grad inside an un-jitted shard_map (JAX refuses a custom_vjp defined with
    symbolic_zeros there: the reason tessera.jax's is not)."""
    from jax.sharding import PartitionSpec as P
    x, w, y = arrays(seed=7)
    mesh = jax.make_mesh((1,), ("i",))
    f = jax.shard_map(lambda a, b: tj.linear_cross_entropy(a, b, y), mesh=mesh, in_specs=(P(), P()), out_specs=P())
    np.testing.assert_allclose(np.asarray(f(x, w)), np.asarray(tj.linear_cross_entropy(x, w, y)), rtol=1e-6)
    g = jax.grad(lambda a: f(a, w))(x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(lambda a: tj.linear_cross_entropy(a, w, y))(x)),
                               rtol=1e-5, atol=1e-7)


def test_call_skip_as_a_string_and_refused_on_forward():
    x, w, y = arrays(seed=8)
    t = {"x": x, "w": w, "labels": y, "grad_loss": jnp.ones((), jnp.float32)}
    out = tj.call("linear_cross_entropy", "backward", t, skip="dw")
    assert set(out) == {"dx"}, set(out)
    full = tj.call("linear_cross_entropy", "backward", t)
    np.testing.assert_array_equal(np.asarray(out["dx"]), np.asarray(full["dx"]))
    with pytest.raises(Exception, match="skip"):
        tj.call("linear_cross_entropy", "forward", {"x": x, "w": w, "labels": y}, skip="dw")


def test_every_input_frozen():
    """x and w both frozen: the fused pass asks for no gradient at all, the loss is unchanged and
    both cotangents are zero."""
    x, w, y = arrays(seed=9)
    loss = lambda x, w, **kw: tj.linear_cross_entropy(x, w, y, **kw)
    v, g = jax.value_and_grad(lambda x, w: loss(x, w, frozen="x,w"), argnums=(0, 1))(x, w)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(loss(x, w)))
    assert not np.any(np.asarray(g[0])) and not np.any(np.asarray(g[1]))


@pytest.mark.parametrize("reduction", ["mean", "none"])  # the fused pass in fwd; forward, then backward
def test_second_derivative_is_refused(reduction):
    """A gradient of a gradient has no rule (the backward's FFI call is not differentiable): JAX
    raises ("The FFI call to `tessera_call` cannot be differentiated") instead of returning a
    wrong second derivative."""
    x, w, y = arrays(seed=4)

    def dx_norm(x):
        return (jax.grad(lambda x: tj.linear_cross_entropy(x, w, y, reduction=reduction).sum())(x) ** 2).sum()

    with pytest.raises(Exception, match="tessera_call` cannot be differentiated"):
        jax.grad(dx_norm)(x)
