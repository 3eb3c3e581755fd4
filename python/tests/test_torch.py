"""tessera.torch: the custom op and its autograd against PyTorch's own autodiff of the
materialized loss (F.cross_entropy on x @ w.T), torch.compile, the Liger-style module, errors."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import tessera  # noqa: E402
import tessera.torch as tt  # noqa: E402
from tessera import _ext  # noqa: E402

import reference as ref  # noqa: E402


def tensors(seed=0, dtype=torch.float32, bias=False):
    x, w, y = ref.problem(seed=seed)
    out = [torch.from_numpy(x).to(dtype).requires_grad_(), torch.from_numpy(w).to(dtype).requires_grad_(),
           torch.from_numpy(y)]
    if bias:
        out.append(torch.from_numpy(np.random.default_rng(seed).standard_normal(w.shape[0]).astype(np.float32))
                   .to(dtype).requires_grad_())
    return out


def materialized(x, w, y, bias=None, reduction="mean", ignore_index=-100, label_smoothing=0.0,
                 z_loss_weight=0.0, softcap=0.0):
    """The materialized loss: F.cross_entropy on the logits (+ z-loss and soft cap by hand)."""
    z = F.linear(x, w, bias).float()
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    ce = F.cross_entropy(z, y, reduction="none", ignore_index=ignore_index, label_smoothing=label_smoothing)
    keep = y != ignore_index
    per = ce + z_loss_weight * torch.where(keep, torch.logsumexp(z, -1) ** 2, 0.0)
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.sum() / keep.sum()


def grads_of(loss_fn, args):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    loss = loss_fn(*args)
    loss.backward(torch.linspace(0.5, 2.0, loss.numel()).reshape(loss.shape) if loss.ndim else None)
    return loss.detach(), [a.grad for a in args if a.requires_grad]


OPTIONS = [
    {},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"label_smoothing": 0.1},
    {"z_loss_weight": 1e-3},
    {"softcap": 5.0},
    {"reduction": "sum", "label_smoothing": 0.2, "z_loss_weight": 1e-2, "softcap": 3.0},
]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_value_and_gradients_vs_autograd(opts):
    args = tensors(bias=True)
    v, g = grads_of(lambda x, w, y, b: tt.linear_cross_entropy(x, w, y, bias=b, **opts), args)
    rv, rg = grads_of(lambda x, w, y, b: materialized(x, w, y, bias=b, **opts), args)
    torch.testing.assert_close(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=2e-6)


def test_soft_cap_is_the_older_spelling_of_softcap():
    """soft_cap= (linear_cross_entropy's name until 2026-11-29) keeps working, on the fused pass
    too (grad on), with the same loss and gradients; both spellings at once is an error."""
    x, w, y = tensors()
    new_v, new_g = grads_of(lambda x, w: tt.linear_cross_entropy(x, w, y, softcap=3.0), [x, w])
    old_v, old_g = grads_of(lambda x, w: tt.linear_cross_entropy(x, w, y, soft_cap=3.0), [x, w])
    assert torch.equal(new_v, old_v) and all(torch.equal(a, b) for a, b in zip(new_g, old_g))
    assert not torch.equal(new_v, tt.linear_cross_entropy(x, w, y).detach())
    with pytest.raises(TypeError, match="older spelling"):
        tt.linear_cross_entropy(x, w, y, softcap=3.0, soft_cap=3.0)


def test_bf16_gradients_keep_the_dtype():
    x, w, y = tensors(dtype=torch.bfloat16)
    v, (gx, gw) = grads_of(lambda x, w, y: tt.linear_cross_entropy(x, w, y), [x, w, y])
    assert gx.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16
    rv, (rx, rw) = grads_of(lambda x, w, y: materialized(x.float(), w.float(), y), [x, w, y])
    torch.testing.assert_close(v, rv, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(gx.float(), rx.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(gw.float(), rw.float(), rtol=2e-2, atol=2e-3)


def test_transposed_weight_view_gets_its_gradient_in_its_layout():
    x, w, y = tensors()
    w_hv = w.detach().t().contiguous().requires_grad_()  # a parameter stored [H, V]
    loss = tt.linear_cross_entropy(x, w_hv.t(), y)      # passed as a [V, H] view, no copy
    loss.backward()
    rv, (_, rw) = grads_of(lambda x, w, y: materialized(x, w, y), [x, w, y])
    torch.testing.assert_close(loss.detach(), rv)
    torch.testing.assert_close(w_hv.grad.t(), rw, rtol=1e-4, atol=2e-6)


def test_opcheck():
    x, w, y, b = tensors(bias=True)
    torch.library.opcheck(torch.ops.tessera.linear_cross_entropy.default, (x, w, y, b),
                          {"reduction": "sum", "z_loss_weight": 1e-3})


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    x, w, y = tensors()
    torch._dynamo.reset()

    def step(x, w, y):
        h = torch.tanh(x) * 2  # some graph around the op
        return tt.linear_cross_entropy(h, w, y, label_smoothing=0.1)

    compiled = torch.compile(step, fullgraph=True, backend=backend)  # fullgraph: a graph break is an error
    v, g = grads_of(compiled, [x, w, y])
    rv, rg = grads_of(lambda x, w, y: materialized(torch.tanh(x) * 2, w, y, label_smoothing=0.1), [x, w, y])
    torch.testing.assert_close(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=2e-6)


def test_liger_style_module():
    x, w, y = tensors()
    loss_fn = tt.LinearCrossEntropyLoss(ignore_index=-100, lse_square_scale=1e-3, label_smoothing=0.1, softcap=4.0)
    v, g = grads_of(lambda w, x, y: loss_fn(w, x, y), [w, x, y])  # Liger's order: (lin_weight, _input, target)
    rv, rg = grads_of(lambda w, x, y: materialized(x, w, y, z_loss_weight=1e-3, label_smoothing=0.1, softcap=4.0),
                      [w, x, y])
    torch.testing.assert_close(v, rv, rtol=2e-5, atol=1e-6)
    for a, r in zip(g, rg):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=2e-6)
    cw = torch.linspace(0.2, 2.0, w.shape[0])
    loss_fn = tt.LinearCrossEntropyLoss(ce_weight=cw, label_smoothing=0.1)  # Liger's ce_weight
    torch.testing.assert_close(loss_fn(w, x, y), F.cross_entropy(F.linear(x, w).float(), y, weight=cw,
                                                                 label_smoothing=0.1), rtol=2e-5, atol=2e-6)
    with pytest.raises(NotImplementedError, match="Liger's z-loss is not class-weighted"):
        tt.LinearCrossEntropyLoss(ce_weight=cw, lse_square_scale=1e-3)
    assert "ce_weight" in dict(loss_fn.named_buffers())
    loss, z_loss, acc = tt.LinearCrossEntropyLoss(lse_square_scale=1e-3, return_z_loss=True,
                                                  return_token_accuracy=True)(w, x, y)
    assert z_loss.shape == () and acc.shape == () and loss.requires_grad


def test_z_loss_and_token_accuracy_outputs():
    """Liger's return_z_loss / return_token_accuracy: the z-loss part alone and the argmax hit rate."""
    x, w, y = tensors(seed=7)
    y = y.clone()
    y[::5] = -100
    lam = 1e-2
    loss, z_loss, acc = tt.linear_cross_entropy(x, w, y, z_loss_weight=lam, return_z_loss=True,
                                                return_token_accuracy=True)
    logits = F.linear(x, w).detach().double()
    kept = y != -100
    lse = torch.logsumexp(logits, dim=-1)[kept]
    torch.testing.assert_close(z_loss.double(), lam * (lse ** 2).mean(), rtol=1e-5, atol=1e-7)
    hits = (logits.argmax(dim=-1)[kept] == y[kept]).double().mean()
    torch.testing.assert_close(acc.double(), hits)
    plain = tt.linear_cross_entropy(x, w, y, z_loss_weight=lam)
    torch.testing.assert_close(loss, plain, rtol=0, atol=0)  # the metrics change nothing else
    gx, = torch.autograd.grad(loss, (x,))
    px, = torch.autograd.grad(plain, (x,))
    torch.testing.assert_close(gx, px, rtol=0, atol=0)
    per_token, z_none = tt.linear_cross_entropy(x, w, y, z_loss_weight=lam, reduction="none", return_z_loss=True)
    assert z_none.shape == y.shape and float(z_none[~kept].abs().sum()) == 0.0
    assert per_token.requires_grad and not z_none.requires_grad and not acc.requires_grad  # metrics


def test_top_level_function_and_zero_copy():
    x, w, y = tensors()
    assert _ext.view(x.detach())["data"] == x.data_ptr()
    assert _ext.view(w.detach()[8:])["data"] == w.data_ptr() + 8 * w.shape[1] * 4
    loss = tessera.linear_cross_entropy(x, w, y)  # a torch tensor in, a differentiable torch tensor out
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    torch.testing.assert_close(loss.detach(), materialized(x, w, y).detach())


def test_bad_inputs_raise():
    x, w, y = tensors()
    with pytest.raises(TypeError, match="w dtype bf16 differs from x dtype f32"):
        tt.linear_cross_entropy(x, w.to(torch.bfloat16), y)
    with pytest.raises(TypeError, match="float64"):
        tt.linear_cross_entropy(x.double(), w.double(), y)
    with pytest.raises(ValueError, match="outside"):
        tt.linear_cross_entropy(x, w, torch.full_like(y, 1000))
    with pytest.raises(ValueError, match="reduction must be one of"):
        tt.linear_cross_entropy(x, w, y, reduction="avg")


def test_autocast_runs_the_kernel_in_the_autocast_dtype():
    """Under torch.autocast an f32 weight meets a bf16 activation (AMP training): the matmul operands
    are cast to the autocast dtype as torch.matmul's would be, and the f32 parameter's gradient comes
    back in f32 through the cast. Outside autocast the mismatch is still an error."""
    x, w, y = tensors()
    xb = x.detach().to(torch.bfloat16).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = tt.linear_cross_entropy(xb, w, y)
    loss.backward()
    assert w.grad.dtype == torch.float32 and xb.grad.dtype == torch.bfloat16
    rv, (rx, rw) = grads_of(lambda x, w, y: materialized(x.float(), w.to(torch.bfloat16).float(), y),
                            [xb, w, y])
    torch.testing.assert_close(loss.detach(), rv, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(w.grad, rw, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(xb.grad.float(), rx.float(), rtol=2e-2, atol=2e-3)
    with pytest.raises(TypeError, match="differs from x dtype"):
        tt.linear_cross_entropy(xb, w, y)
    # The inputs of a computation's dtype only: attention's q, k, v; grouped_matmul's operands.
    q = torch.randn(1, 16, 2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        o = tt.attention(q, q.to(torch.bfloat16), q, causal=True)
    o = o[0] if isinstance(o, tuple) else o
    assert o.dtype == torch.bfloat16
    lhs, rhs = torch.randn(6, 4), torch.randn(2, 4, 3).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = tt.grouped_matmul(lhs, rhs, torch.tensor([2, 4]))
    torch.testing.assert_close(out.float(), torch.cat([lhs[:2].to(torch.bfloat16).float() @ rhs[0].float(),
                                                       lhs[2:].to(torch.bfloat16).float() @ rhs[1].float()]),
                               rtol=1e-2, atol=1e-2)


def test_module_class_weights_survive_a_bf16_model():
    """model.bfloat16() casts the module's buffers too: ce_weight is handed to the kernel in f32."""
    x, w, y = tensors()
    cw = torch.linspace(0.2, 2.0, w.shape[0])
    loss_fn = tt.LinearCrossEntropyLoss(ce_weight=cw).bfloat16()
    assert loss_fn.ce_weight.dtype == torch.bfloat16
    want = F.cross_entropy(F.linear(x, w).float(), y, weight=cw.to(torch.bfloat16).float())
    torch.testing.assert_close(loss_fn(w, x, y), want, rtol=2e-5, atol=2e-6)


def test_ops_stay_out_of_cuda_graphs():
    """Inductor's reduce-overhead mode must not capture the ops (host reads and syncs inside)."""
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip("this PyTorch has no cudagraph_unsafe tag")
    from tessera._registry import KERNELS
    for name in KERNELS:
        for op in (name, name + "_backward"):
            assert torch.Tag.cudagraph_unsafe in getattr(torch.ops.tessera, op).default.tags, op
    assert torch.Tag.cudagraph_unsafe in torch.ops.tessera.linear_cross_entropy_fused.default.tags


def test_class_weights_match_cross_entropy_weight():
    """class_weights= is F.cross_entropy's weight= (Liger's ce_weight): loss and both gradients."""
    x, w, y = tensors(seed=5)
    cw = torch.from_numpy(np.random.default_rng(5).random(w.shape[0]).astype(np.float32))
    got = tt.linear_cross_entropy(x, w, y, class_weights=cw)
    gx, gw = torch.autograd.grad(got, (x, w))
    want = F.cross_entropy(F.linear(x, w).float(), y, weight=cw, ignore_index=-100)
    wx, ww = torch.autograd.grad(want, (x, w))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(gx, wx, rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(gw, ww, rtol=2e-4, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_class_weights_with_label_smoothing_match_cross_entropy(reduction):
    """weight= with label_smoothing=: PyTorch's own definition (the smoothing term weighted per class)."""
    x, w, y = tensors(seed=6)
    cw = torch.from_numpy(np.random.default_rng(6).random(w.shape[0]).astype(np.float32))
    cw[int(y[y != -100][0])] = 0.0  # a token whose class counts for nothing still has a smoothing term
    got = tt.linear_cross_entropy(x, w, y, class_weights=cw, label_smoothing=0.15, reduction=reduction)
    want = F.cross_entropy(F.linear(x, w).float(), y, weight=cw, ignore_index=-100,
                           label_smoothing=0.15, reduction=reduction)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-6)
    up = torch.rand_like(want) + 0.5
    gx, gw = torch.autograd.grad(got, (x, w), up)
    wx, ww = torch.autograd.grad(want, (x, w), up)
    torch.testing.assert_close(gx, wx, rtol=2e-4, atol=2e-6)
    torch.testing.assert_close(gw, ww, rtol=2e-4, atol=2e-6)


# --- Fused pass in the forward (reduction sum / mean with a gradient asked for) -----------------

FUSED_OPTIONS = [
    {"reduction": "mean"},
    {"reduction": "sum"},
    {"reduction": "mean", "label_smoothing": 0.1, "z_loss_weight": 1e-3},
    {"reduction": "sum", "label_smoothing": 0.2, "z_loss_weight": 1e-2, "softcap": 3.0},
]


def two_paths(dtype, opts, scale=None, seed=3):
    """(loss, grads) through tt.linear_cross_entropy (the fused op in the forward) and through the
    forward op + backward op (today's path, tt._single_device_linear_cross_entropy)."""
    args = tensors(seed=seed, dtype=dtype, bias=True)  # labels have ignore_index rows (every 5th)
    out = []
    for fn in (tt.linear_cross_entropy, tt._single_device_linear_cross_entropy):
        a = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
        loss = fn(a[0], a[1], a[2], bias=a[3], **opts)
        (loss if scale is None else loss * scale).backward()
        out.append((loss, [a[0].grad, a[1].grad, a[3].grad]))
    (lf, gf), (lp, gp) = out
    assert "fused" in type(lf.grad_fn).__name__ and "fused" not in type(lp.grad_fn).__name__
    return lf.detach(), gf, lp.detach(), gp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("opts", FUSED_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_fused_in_forward_matches_forward_then_backward(dtype, opts):
    lf, gf, lp, gp = two_paths(dtype, opts)
    assert torch.equal(lf, lp)  # the fused pass's loss is the forward's, bit for bit
    for a, r in zip(gf, gp):
        assert a.dtype == r.dtype == dtype
        # The C++ fused pass and the backward pass round a few elements differently (the same
        # math, a different order of f32 operations): about 1 f32 ulp of the summed terms (~0.03:
        # 2e-9) where they cancel, so atol 1e-8 (grads are ~1e-2); in bf16 that can flip one
        # rounding: 1 bf16 ulp (2^-8 relative).
        tol = dict(rtol=1e-6, atol=1e-8) if dtype == torch.float32 else dict(rtol=2 ** -8, atol=1e-6)
        torch.testing.assert_close(a, r, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fused_in_forward_scales_by_the_upstream_gradient(dtype):
    opts = {"reduction": "sum", "label_smoothing": 0.1}
    _, g1, _, _ = two_paths(dtype, opts)
    lf, g3, lp, gp3 = two_paths(dtype, opts, scale=3.0)
    for a, one in zip(g3, g1):  # the saved gradients times 3, in f32, rounded once to the dtype
        assert torch.equal(a, (one.float() * 3.0).to(dtype))
    for a, r in zip(g3, gp3):
        # Against grad_loss=3 inside the kernel, which scales each dlogit before the gradient
        # GEMMs (in bf16 it rounds them to bf16 there): the two round differently where terms
        # cancel, so the error is relative to the gradient's scale, not to each element: a few
        # ulps of max|g| (f32: 1e-6; bf16: 2^-6, the dlogits' and the result's roundings).
        scale = r.float().abs().max().item()
        tol = (dict(rtol=1e-5, atol=1e-6 * scale) if dtype == torch.float32 else
               dict(rtol=2 ** -7, atol=2 ** -6 * scale))
        torch.testing.assert_close(a.float(), r.float(), **tol)


def test_fused_in_forward_extra_outputs_are_the_forwards():
    x, w, y, b = tensors(seed=5, bias=True)
    kw = dict(bias=b, z_loss_weight=1e-3, return_z_loss=True, return_token_accuracy=True, return_argmax=True,
              return_lse=True)
    fused = tt.linear_cross_entropy(x, w, y, **kw)
    plain = tt._single_device_linear_cross_entropy(x, w, y, **kw)
    assert "fused" in type(fused[0].grad_fn).__name__
    assert len(fused) == len(plain) == 5
    for a, r in zip(fused, plain):
        assert torch.equal(a, r)
    assert all(not o.requires_grad for o in fused[1:])  # metrics and lse carry no gradient


def test_fused_opcheck():
    x, w, y, b = tensors(bias=True)
    torch.library.opcheck(torch.ops.tessera.linear_cross_entropy_fused.default, (x, w, y, b),
                          {"reduction": "sum", "z_loss_weight": 1e-3})


def test_fused_in_forward_with_retain_graph_accumulates():
    x, w, y = tensors()
    loss = tt.linear_cross_entropy(x, w, y)
    loss.backward(retain_graph=True)
    once = x.grad.clone()
    loss.backward(retain_graph=True)
    loss.backward()  # the saved gradients are returned, never accumulated into
    assert torch.equal(x.grad, 3 * once)


def test_forward_only_when_no_gradient_is_asked(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the fused pass ran without a gradient asked for")

    monkeypatch.setattr(tt, "_fused_linear_cross_entropy", refuse)
    x, w, y = tensors()
    with torch.no_grad():
        assert tt.linear_cross_entropy(x, w, y).grad_fn is None
    assert tt.linear_cross_entropy(x.detach(), w.detach(), y).grad_fn is None
    per_token = tt.linear_cross_entropy(x, w, y, reduction="none")  # not a scalar: forward, then backward
    per_token.backward(torch.linspace(0.5, 2.0, per_token.numel()))
    rx = x.detach().clone().requires_grad_()
    materialized(rx, w.detach(), y, reduction="none").backward(torch.linspace(0.5, 2.0, per_token.numel()))
    torch.testing.assert_close(x.grad, rx.grad, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_fused_in_forward_under_torch_compile_fullgraph(reduction):
    x, w, y = tensors(dtype=torch.bfloat16)
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    def step(x, w, y):
        return tt.linear_cross_entropy(x, w, y, reduction=reduction) * 3.0

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    v, g = grads_of(compiled, [x, w, y])
    rv, rg = grads_of(step, [x, w, y])
    assert any("linear_cross_entropy_fused" in s for s in graphs)
    assert torch.equal(v, rv)
    for a, r in zip(g, rg):
        assert torch.equal(a, r)


def _record_skips(monkeypatch):
    """The `skip` of every kernel call (tessera's _ext.call), in order."""
    seen = []
    real = _ext.call

    def spy(*args, **kwargs):
        seen.append((args[1], list(kwargs.get("skip", []))))
        return real(*args, **kwargs)

    monkeypatch.setattr(_ext, "call", spy)
    return seen


@pytest.mark.parametrize("reduction", ["mean", "none"], ids=["fused", "backward"])
@pytest.mark.parametrize("frozen", [("w",), ("x",), ("bias",), ("w", "bias")], ids=lambda f: "+".join(f))
def test_frozen_inputs_skip_their_gradients(monkeypatch, reduction, frozen):
    """A frozen lm_head (LoRA) costs no dw: the kernel is asked to skip it (the fused op for a scalar
    loss, the backward op for reduction='none'), and the gradients that are computed are the same
    bits as with every input trainable."""
    args = tensors(seed=4, bias=True)
    names = ("x", "w", "y", "bias")
    full = [t.detach().clone().requires_grad_(t.requires_grad) for t in args]
    part = [t.detach().clone().requires_grad_(t.requires_grad and n not in frozen) for n, t in zip(names, args)]
    up = None if reduction == "mean" else torch.linspace(0.5, 2.0, args[2].numel())
    tt.linear_cross_entropy(full[0], full[1], full[2], bias=full[3], reduction=reduction).backward(up)
    seen = _record_skips(monkeypatch)
    tt.linear_cross_entropy(part[0], part[1], part[2], bias=part[3], reduction=reduction).backward(up)
    want_pass = "fused" if reduction == "mean" else "backward"
    assert (want_pass, ["d" + n for n in ("x", "w", "bias") if n in frozen]) in seen, seen
    for n, a, r in zip(names, part, full):
        if n == "y":
            continue
        if n in frozen:
            assert a.grad is None
        else:
            assert torch.equal(a.grad, r.grad), n


def test_frozen_weight_under_torch_compile(monkeypatch):
    x, w, y = tensors(dtype=torch.bfloat16)
    w = w.detach()  # frozen
    torch._dynamo.reset()

    def step(x, w, y):
        return tt.linear_cross_entropy(x, w, y)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    seen = _record_skips(monkeypatch)
    v, g = grads_of(compiled, [x, w, y])
    assert ("fused", ["dw"]) in seen, seen  # the compiled graph's fused op skips dw too
    rv, rg = grads_of(step, [x, w, y])
    assert len(g) == len(rg) == 1
    assert torch.equal(v, rv) and torch.equal(g[0], rg[0])


def test_skip_opcheck():
    """The ops with skip: fake and real agree on the outputs left out (torch.library.opcheck)."""
    x, w, y, b = tensors(seed=8, bias=True)
    g = torch.tensor(1.0)
    torch.library.opcheck(torch.ops.tessera.linear_cross_entropy_backward, (x.detach(), w.detach(), y, g),
                          {"bias": b.detach(), "skip": "dw,dbias"})
    torch.library.opcheck(torch.ops.tessera.linear_cross_entropy_fused, (x.detach(), w.detach(), y),
                          {"bias": b.detach(), "reduction": "sum", "skip": "dw"})


def test_numpy_call_skip():
    x, w, y = ref.problem(seed=2)
    base = dict(x=x, w=w, labels=y, grad_loss=np.float32(1.0))
    full = tessera.call("linear_cross_entropy", "backward", base)
    part = tessera.call("linear_cross_entropy", "backward", base, skip=["dw"])
    assert sorted(part) == ["dx"] and sorted(full) == ["dw", "dx"]
    assert np.array_equal(part["dx"], full["dx"])
    assert sorted(tessera.call("linear_cross_entropy", "backward", base, skip="dx,dw")) == []
    with pytest.raises(ValueError, match=r"forward computes no gradient to skip"):
        tessera.call("linear_cross_entropy", "forward", dict(x=x, w=w, labels=y), skip=["dw"])
    with pytest.raises(ValueError, match=r"cannot skip 'lse' \(skippable: dx, dw, dbias\)"):
        tessera.call("linear_cross_entropy", "backward", base, skip=["lse"])
    q = np.zeros((1, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"attention: cannot skip 'dq' \(skippable: dbias\)"):
        tessera.call("attention", "backward", dict(q=q, k=q, v=q, grad_o=q), skip=["dq"])
    with pytest.raises(ValueError, match=r"mlstm: cannot skip 'dq' \(skippable: none\)"):
        tessera.call("mlstm", "backward", dict(q=q, k=q, v=q), skip=["dq"])


def test_fused_in_forward_f16_keeps_small_gradients_under_a_loss_scale():
    """f16 with a GradScaler-style loss scale: the fused pass computes the gradients at an upstream
    gradient of 1, where a mean loss's small dw entries are f16 subnormals (2^-24 steps). They are
    held in f32 and rounded to f16 after the scale, so w.grad / scale is as good as f16 allows:
    within a few 2^-11 of each entry (the plain path, with the scale inside the kernel, does as
    well). Held in f16 they were off by up to 2^-24 / |entry| (~6 % at 1e-6)."""
    g = torch.Generator().manual_seed(9)
    B, H, V, scale = 512, 32, 4096, 65536.0
    x = torch.randn(B, H, generator=g).half().requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.2).half().requires_grad_()
    y = torch.randint(0, V, (B,), generator=g)
    loss = tt.linear_cross_entropy(x, w, y)
    assert "fused" in type(loss.grad_fn).__name__
    (loss * scale).backward()
    got = w.grad.double() / scale
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.cross_entropy(xd @ wd.T, y).backward()
    want = wd.grad
    small = (want.abs() > 1e-7) & (want.abs() < 6e-5)  # f16 subnormals at scale 1
    assert small.sum() > 1000
    rel = ((got - want).abs() / want.abs())[small]
    # f16 rounding of the inputs' products is exact in f32; the f32 sums over 512 tokens and the
    # final rounding to f16 at ~65536·|entry| (normal): 2^-11 relative, a few of them.
    assert rel.max() < 4 * 2 ** -11, rel.max()


@pytest.mark.parametrize("reduction", ["mean", "none"])  # the fused op's backward; the backward op
def test_second_derivative_is_refused(reduction):
    """A backward that autograd records (create_graph=True: a gradient penalty, a Hessian-vector
    product) raises when it reaches a kernel: its backward ops have no autograd formula, and
    PyTorch once treated them as constants (a wrong second derivative, a warning at most)."""
    x, w, y = tensors(seed=3)
    loss = tt.linear_cross_entropy(x, w, y, reduction=reduction).sum()
    with pytest.raises(RuntimeError, match="linear_cross_entropy: no second derivative"):
        torch.autograd.grad(loss, (x, w), create_graph=True)
    dx, dw = torch.autograd.grad(tt.linear_cross_entropy(x, w, y, reduction=reduction).sum(), (x, w))
    assert dx.abs().sum() > 0 and dw.abs().sum() > 0  # the first derivative as before
    q = torch.randn(1, 5, 2, 4, requires_grad=True)
    k, v = torch.randn(1, 6, 2, 4), torch.randn(1, 6, 2, 4)
    with pytest.raises(RuntimeError, match="attention: no second derivative"):
        torch.autograd.grad(tt.attention(q, k, v, causal=True).sum(), q, create_graph=True)


def test_an_int_option_refuses_a_bool():
    """ignore_index=True ran as ignore_index=1 (the op's schema takes a bool as an int); NumPy and
    JAX refuse it (a reviewer's finding)."""
    x, w = torch.randn(4, 8), torch.randn(10, 8)
    y = torch.tensor([1, 2, 3, 4])
    with pytest.raises(TypeError, match="ignore_index must be an int, got bool"):
        tt.linear_cross_entropy(x, w, y, ignore_index=True)
    with pytest.raises(TypeError, match="group_offset must be an int, got bool"):
        tt.grouped_matmul(torch.zeros(2, 8), torch.ones(1, 8, 5), torch.tensor([2, 0]), group_offset=True)
    assert torch.isfinite(tt.linear_cross_entropy(x, w, y, ignore_index=1))


@pytest.mark.parametrize("fused", [True, False])
def test_strided_views_take_gradients_like_their_copies(fused):
    """hidden[:, :-1] (the shifted hidden states of an LM, a strided view) reaches the kernel
    as one copy; the gradient comes back to the view's elements and nowhere else; w (contiguous)
    gets the same gradient bits. fused: the
    scalar loss's fused pass; else reduction="none" (forward, then the backward pass)."""
    _, w, _ = tensors()
    hidden = torch.randn(4, 7, w.shape[1], generator=torch.Generator().manual_seed(1)).requires_grad_()
    labels = torch.from_numpy(ref.problem(B=24)[2]).reshape(4, 6)
    reduce = (lambda l: l) if fused else (lambda l: l.sum())
    kw = {} if fused else {"reduction": "none"}
    view = hidden[:, :-1]
    assert not view.is_contiguous()
    reduce(tt.linear_cross_entropy(view, w, labels, **kw)).backward()
    copy = hidden.detach()[:, :-1].contiguous().requires_grad_()
    w2 = w.detach().clone().requires_grad_()
    reduce(tt.linear_cross_entropy(copy, w2, labels, **kw)).backward()
    torch.testing.assert_close(hidden.grad[:, :-1], copy.grad, rtol=0, atol=0)
    assert hidden.grad[:, -1].abs().max() == 0
    torch.testing.assert_close(w.grad, w2.grad, rtol=0, atol=0)


def test_torch_func_transforms_are_refused_by_name():
    """torch.func.grad / vmap cannot transform the ops (register_autograd's autograd.Function has
    no setup_context; no vmap rule): a RuntimeError that says so and what to use instead, not
    PyTorch's message about setup_context. functional_call alone is not a transform and works."""
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match="torch.func transforms .* are not supported"):
        torch.func.grad(lambda q: tt.attention(q, q, q).sum())(q)
    with pytest.raises(RuntimeError, match="tessera.torch.attention: torch.func transforms"):
        torch.vmap(lambda q: tt.attention(q, q, q))(q[None].expand(3, -1, -1, -1, -1))
    lin = torch.nn.Linear(16, 32, bias=False)
    x, y = torch.randn(6, 16), torch.randint(0, 32, (6,))
    w = torch.func.functional_call(lin, {"weight": 2 * lin.weight}, (torch.eye(16),)).T
    torch.testing.assert_close(tt.linear_cross_entropy(x, w, y), tt.linear_cross_entropy(x, 2 * lin.weight, y))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:FutureWarning")
def test_eager_forward_skips_the_dispatcher_only_where_nothing_must_see_the_op(monkeypatch):
    """A no-grad eager forward runs the op's implementation directly (PyTorch's dispatcher cost
    ~25–50 µs of a small call): the same bits as the op. A dispatch mode, a torch-function mode,
    the profiler, TorchScript tracing, an input that records a gradient or one with a pending
    negation still go through the op (a review: jit.trace recorded a graph without the call, and
    a negative view was read without its negation)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    import tessera.torch as module

    decided = []
    plain = module._plain_eager
    monkeypatch.setattr(module, "_plain_eager", lambda ts: decided.append(plain(ts)) or decided[-1])
    q = torch.randn(1, 6, 2, 8)
    want = torch.ops.tessera.attention(q, q, q)[0]
    torch.testing.assert_close(tt.attention(q, q, q), want, rtol=0, atol=0)
    g = q.clone().requires_grad_()
    with torch.no_grad():
        torch.testing.assert_close(tt.attention(g, g, g), want, rtol=0, atol=0)
    assert decided == [True, True]       # the direct path was taken

    def recording(mode, hook):
        """A `mode` (dispatch or torch-function) whose `hook` records each function it sees, then
        calls it (both hooks take the same arguments)."""
        def init(self):
            mode.__init__(self)
            self.seen = []

        def record(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))
        return type("Recording" + mode.__name__, (mode,), {"__init__": init, hook: record})

    for mode, hook in ((TorchDispatchMode, "__torch_dispatch__"), (TorchFunctionMode, "__torch_function__")):
        with recording(mode, hook)() as rec:
            tt.attention(q, q, q)
        assert any("tessera.attention" in f for f in rec.seen), (mode.__name__, rec.seen)
    with torch.profiler.profile() as prof:
        tt.attention(q, q, q)
    assert any("tessera::attention" in e.key for e in prof.key_averages())
    traced = torch.jit.trace(lambda a: tt.attention(a, a, a), (q,))
    q2 = torch.randn(1, 6, 2, 8)
    torch.testing.assert_close(traced(q2), torch.ops.tessera.attention(q2, q2, q2)[0], rtol=0, atol=0)
    n = torch._neg_view(q)
    torch.testing.assert_close(tt.attention(n, n, n), torch.ops.tessera.attention(-q, -q, -q)[0], rtol=0, atol=0)
    decided.clear()
    tt.attention(g, g, g).sum().backward()
    assert decided == [False] and g.grad.abs().max() > 0
